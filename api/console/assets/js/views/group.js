// Group: the members, which partition each holds as active or standby, lag per partition
// in records and ms, restore and standby progress, the last rebalances and how long they
// paused processing (GET /group, every second).
import { useMemo } from "preact/hooks";

import { useFirstPaint, usePoll } from "../api.js";
import { Chart } from "../chart.js";
import { clock, count, ms, rate, seconds, shortUrl } from "../format.js";
import { html } from "../html.js";
import { Badge, Problem, Updated } from "./common.js";

const LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";

function totals(member) {
  const sum = (list) => (list || []).reduce((n, r) => n + r.per_s, 0);
  const rates = member.rates || {};
  return { read: sum(rates.read), sent: sum(rates.sent) };
}

function Members({ members }) {
  return html`
    <table class="members">
      <thead><tr><th></th><th>member</th><th>status</th><th>generation</th><th class="num">active</th>
        <th class="num">standby</th><th class="num">read/s</th><th class="num">sent/s</th><th>last rebalance</th></tr></thead>
      <tbody>
        ${members.map((m, n) => {
          const t = totals(m);
          const last = (m.rebalances || [])[0];
          const held = (side) => Object.values(m[side] || {}).reduce((k, ps) => k + ps.length, 0);
          return html`<tr key=${m.url} data-member=${m.url}>
            <td><span class="letter">${LETTERS[n]}</span></td>
            <td>${shortUrl(m.url)}</td>
            <td><${Badge} kind=${m.status}>${m.status}<//>${m.failure ? html` <span class="error">${m.failure}</span>` : ""}</td>
            <td>${m.generation ?? "–"}</td>
            <td class="num">${m.reachable ? held("active") : "–"}</td>
            <td class="num">${m.reachable ? held("standby") : "–"}</td>
            <td class="num">${m.reachable ? rate(t.read) : "–"}</td>
            <td class="num">${m.reachable ? rate(t.sent) : "–"}</td>
            <td>${last ? `${clock(last.started_at * 1000)}, paused ${seconds(last.paused_s)}` : "none"}</td>
          </tr>`;
        })}
      </tbody>
    </table>`;
}

/** Partition grid: per row, the owners of each partition and their lag. */
function Grid({ rows, partitions, caption, cell, kind }) {
  const columns = [...Array(partitions).keys()];
  return html`
    <table class=${`grid ${kind}`}>
      <caption>${caption}</caption>
      <thead><tr><th></th>${columns.map((p) => html`<th class="num">${p}</th>`)}</tr></thead>
      <tbody>${rows.map((row) => html`<tr key=${row}><td>${row}</td>${columns.map((p) => cell(row, p))}</tr>`)}</tbody>
    </table>`;
}

function Copies({ members, partitions }) {
  const copies = new Map();
  members.forEach((m, n) => (m.copies || []).forEach((c) => {
    const key = `${c.table}/${c.partition}`;
    copies.set(key, [...(copies.get(key) || []), { ...c, letter: LETTERS[n] }]);
  }));
  const tables = [...new Set([...copies.keys()].map((k) => k.slice(0, k.lastIndexOf("/"))))].sort();
  const cell = (table, p) => {
    const held = (copies.get(`${table}/${p}`) || []).sort((a, b) => (a.replica === "active" ? -1 : 1) - (b.replica === "active" ? -1 : 1));
    const behind = Math.max(0, ...held.map((c) => c.lag_records || 0));
    const title = held.map((c) => `${c.letter} ${c.replica}: ${count(c.lag_records)} records (${ms(c.lag_ms)}) behind its inputs, ${count(c.changelog_lag)} behind its changelog`).join("\n");
    return html`<td class=${`cell ${behind > 1000 ? "far" : behind > 0 ? "behind" : ""}`} title=${title}
      data-table=${table} data-partition=${p}>
      ${held.map((c) => html`<span class=${c.replica}>${c.replica === "active" ? c.letter : c.letter.toLowerCase()}</span>`)}
      ${held.length ? html`<small>${count(behind)}${behind ? ` · ${ms(Math.max(...held.map((c) => c.lag_ms || 0)))}` : ""}</small>` : html`<span class="none">·</span>`}
    </td>`;
  };
  return html`<${Grid} kind="copies" rows=${tables} partitions=${partitions} cell=${cell}
    caption="Upper case: the active copy; lower case: standbys; the figure: records behind the inputs (and their age) of the copy furthest behind. Hover a cell for each copy." />`;
}

function Sources({ members, partitions }) {
  const found = new Map();
  members.forEach((m, n) => (m.sources || []).forEach((s) => found.set(`${s.topic}/${s.partition}`, { ...s, letter: LETTERS[n] })));
  const topics = [...new Set([...found.values()].map((s) => s.topic))].sort();
  const cell = (topic, p) => {
    const s = found.get(`${topic}/${p}`);
    if (!s) return html`<td class="cell"><span class="none">·</span></td>`;
    const title = `${s.letter}: next offset ${count(s.next_offset)}, end ${count(s.end_offset)}`;
    return html`<td class=${`cell ${s.lag_records > 1000 ? "far" : s.lag_records > 0 ? "behind" : ""}`} title=${title}
      data-topic=${topic} data-partition=${p} data-lag=${s.lag_records ?? ""}>
      <span class="active">${s.letter}</span><small>${count(s.lag_records)}${s.lag_records ? ` · ${ms(s.lag_ms)}` : ""}</small></td>`;
  };
  return html`<${Grid} kind="sources" rows=${topics} partitions=${partitions} cell=${cell}
    caption="The member whose task reads each partition, and the records it has not applied yet (and the age of the oldest)." />`;
}

function Progress({ done, total }) {
  const share = total ? Math.min(1, done / total) : 1;
  return html`<progress max="1" value=${share}>${Math.round(share * 100)}%</progress>`;
}

function Restore({ members }) {
  return html`<div class="restores">${members.map((m, n) => {
    const r = m.restore;
    if (!r) return null;
    const standbys = (m.copies || []).filter((c) => c.replica === "standby");
    const behind = standbys.filter((c) => c.changelog_lag);
    const stats = r.stats || {};
    return html`<div class="restore" key=${m.url}>
      <h4><span class="letter">${LETTERS[n]}</span> ${r.in_progress
        ? html`<${Badge} kind="recovering">restoring<//> ${count(r.remaining_total)} changelog records left`
        : "no restore running"}</h4>
      <p>${count(stats.restores ?? 0)} restores; the last took ${seconds(stats.last_duration_s)} for ${count(stats.last_records ?? 0)} records.</p>
      <p>${`${standbys.length} standby copies: ${standbys.length - behind.length} caught up with their changelogs`}${behind.length
        ? `, ${behind.length} behind (at most ${count(Math.max(...behind.map((c) => c.changelog_lag)))} records)` : ""}${
        `; ${count(stats.standby_records ?? 0)} changelog records applied to standbys.`}</p>
      ${r.partitions.filter((p) => p.remaining).length > 0 && html`<ul class="bars">${r.partitions.filter((p) => p.remaining).map((p) => html`<li key=${`${p.table}/${p.partition}`}>
        ${p.table}[${p.partition}] <${Progress} done=${p.offset ?? 0} total=${p.highwater ?? 0} /> ${count(p.remaining)} left</li>`)}</ul>`}
    </div>`;
  })}</div>`;
}

function Rebalances({ members }) {
  const rows = [];
  members.forEach((m, n) => (m.rebalances || []).forEach((r) => rows.push({ ...r, member: n })));
  rows.sort((a, b) => b.started_at - a.started_at);
  return html`
    <table class="rebalances">
      <thead><tr><th>member</th><th>started</th><th class="num">generation</th><th class="num">join</th><th class="num">processing paused</th></tr></thead>
      <tbody>${rows.slice(0, 20).map((r) => html`<tr key=${`${r.member}/${r.number}`}>
        <td>${LETTERS[r.member]}</td><td>${clock(r.started_at * 1000)}</td><td class="num">${r.generation ?? "–"}</td>
        <td class="num">${seconds(r.join_s)}</td><td class="num">${seconds(r.paused_s)}${r.in_progress ? " (running)" : ""}</td></tr>`)}</tbody>
    </table>`;
}

function Throughput({ members }) {
  const { times, series } = useMemo(() => {
    const live = members.filter((m) => (m.history || []).length);
    const stamps = [...new Set(live.flatMap((m) => m.history.map((p) => Math.round(p.at))))].sort((a, b) => a - b);
    const found = live.map((m) => {
      const at = new Map(m.history.map((p) => [Math.round(p.at), p.read]));
      return { label: `${LETTERS[members.indexOf(m)]} read/s`, values: stamps.map((t) => at.get(t) ?? null) };
    });
    return { times: stamps, series: found };
  }, [members]);
  if (!times.length) return html`<p>No throughput sampled yet.</p>`;
  return html`<${Chart} times=${times} series=${series} height=${160} label="records read per second" />`;
}

export function Group() {
  const { data, error, at } = usePoll("group", 1000);
  useFirstPaint("group", Boolean(data));
  return html`
    <section class="view" data-view="group" data-updated=${at}>
      <div class="title"><h2>Group</h2><${Updated} at=${at} /></div>
      <${Problem} error=${error} />
      ${data &&
      html`
        <${Members} members=${data.members} />
        <h3>Throughput</h3>
        <${Throughput} members=${data.members} />
        <h3>Table partitions</h3>
        <${Copies} members=${data.members} partitions=${data.partitions} />
        <h3>Source partitions</h3>
        <${Sources} members=${data.members} partitions=${data.partitions} />
        <h3>Restore and standbys</h3>
        <${Restore} members=${data.members} />
        <h3>Rebalances</h3>
        <${Rebalances} members=${data.members} />`}
    </section>`;
}
