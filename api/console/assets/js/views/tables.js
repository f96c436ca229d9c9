// Tables: pick a table, look up a key (value, partition, the copy that answered, its
// position), page through keys, follow a key live, a windowed key as a chart over its
// windows. Lookups and pages refresh every 2 s; a followed key streams its changes.
import { useEffect, useMemo, useState } from "preact/hooks";

import { REFRESH_MS, follow, segment, useFirstPaint, usePoll } from "../api.js";
import { Chart } from "../chart.js";
import { clock, count, ms } from "../format.js";
import { html } from "../html.js";
import { Problem, Updated } from "./common.js";

const RANGES = [
  ["1 h", 3_600_000],
  ["24 h", 86_400_000],
  ["7 days", 7 * 86_400_000],
];
// index.html asks for the first table's first page before the modules run, with this
// size and the query in this order: change both together.
const PAGE = 20;

function json(value) {
  return JSON.stringify(value, null, 2);
}

function short(value) {
  const text = JSON.stringify(value);
  return text.length > 140 ? `${text.slice(0, 140)}…` : text;
}

function Position({ position }) {
  if (!position) return null;
  const applied = Object.entries(position.applied || {})
    .map(([topic, parts]) => `${topic} ${Object.entries(parts).map(([p, o]) => `${p}:${o}`).join(" ")}`)
    .join("; ");
  return html`<dl class="position">
    <dt>lag</dt><dd>${count(position.lag_records)} records, ${ms(position.lag_ms)}</dd>
    <dt>applied</dt><dd class="mono">${applied || "–"}</dd></dl>`;
}

function Answer({ answer }) {
  return html`<dl class="answer">
    <dt>partition</dt><dd>${answer.partition}</dd>
    <dt>answered by</dt><dd>${answer.served_by} (${answer.replica}${answer.offset_lag ? `, ${count(answer.offset_lag)} changelog records behind` : ""})</dd>
    ${answer.window && html`<dt>window</dt><dd>${clock(answer.window.start)} – ${clock(answer.window.end)}</dd>`}
  </dl>
  <${Position} position=${answer.position} />`;
}

/** Numeric series of the windows' values: the value itself, or each numeric field. */
function windowSeries(windows) {
  const fields = new Set();
  for (const w of windows) {
    if (typeof w.value === "number") fields.add("");
    else if (w.value && typeof w.value === "object") {
      for (const [k, v] of Object.entries(w.value)) if (typeof v === "number") fields.add(k);
    }
  }
  return [...fields].sort().map((field) => ({
    label: field || "value",
    values: windows.map((w) => (field ? w.value?.[field] ?? null : w.value)),
  }));
}

function Windows({ table, name }) {
  const [range, setRange] = useState(RANGES[1][1]);
  // Whole hours: the request stays the same (and refreshes) until the next hour starts.
  const hour = 3_600_000;
  const now = Math.floor(Date.now() / hour) * hour;
  const { data, error, at } = usePoll(
    `tables/${segment(table)}/keys/${segment(name)}?from=${now - range}&to=${now + 2 * hour}`,
    REFRESH_MS,
  );
  const windows = data?.windows || [];
  const series = useMemo(() => windowSeries(windows), [data]);
  return html`<div class="windows" data-windows=${windows.length} data-updated=${at}>
    <div class="row">
      <strong>${count(windows.length)} windows</strong>
      ${RANGES.map(([label, span]) => html`<button class=${span === range ? "on" : ""} onClick=${() => setRange(span)}>${label}</button>`)}
      ${data && html`<span class="muted">answered by ${data.served_by} (${data.replica})</span>`}
    </div>
    <${Problem} error=${error} />
    ${windows.length > 0 && series.length > 0 &&
    html`<${Chart} bars=${true} times=${windows.map((w) => w.start / 1000)} series=${series}
      span=${[(now - range) / 1000, (now + hour) / 1000]} label=${`windows of ${name}`} />`}
    ${windows.length > 0 && html`<table class="compact"><thead><tr><th>window start</th><th>value</th></tr></thead>
      <tbody>${windows.slice(-8).reverse().map((w) => html`<tr key=${w.start}><td>${clock(w.start)}</td><td class="mono">${short(w.value)}</td></tr>`)}</tbody></table>`}
  </div>`;
}

function Lookup({ table, name }) {
  // A windowed key is shown by its windows (a read at "now" finds only the current one).
  const windowed = table.kind === "windowed";
  const path = windowed ? null : `tables/${segment(table.name)}/keys/${segment(name)}`;
  const { data, error, at } = usePoll(path, REFRESH_MS);
  return html`<div class="lookup" data-updated=${at}>
    <div class="title"><h3>${table.name} / <span class="mono">${name}</span></h3>${!windowed && html`<${Updated} at=${at} />`}</div>
    ${error && error.status === 404 ? html`<p class="muted">${error.detail}</p>` : html`<${Problem} error=${error} />`}
    ${data && html`<pre class="value" data-key=${name}>${json(data.value)}</pre><${Answer} answer=${data} />`}
    ${windowed && html`<h4>Windows</h4><${Windows} table=${table.name} name=${name} />`}
    <${Follow} table=${table.name} name=${name} />
  </div>`;
}

function Follow({ table, name }) {
  const [on, setOn] = useState(false);
  const [state, setState] = useState("");
  const [events, setEvents] = useState([]);
  useEffect(() => {
    setEvents([]);
    if (!on) return undefined;
    return follow(
      `tables/${segment(table)}/keys/${segment(name)}/changes`,
      (event, data) => setEvents((list) => [{ at: Date.now(), event, data }, ...list].slice(0, 20)),
      setState,
    );
  }, [on, table, name]);
  return html`<div class="follow" data-events=${events.length}>
    <button onClick=${() => setOn(!on)}>${on ? "Stop following" : "Follow live"}</button>
    ${on && html`<span class="muted">${state}</span>`}
    ${events.length > 0 && html`<table class="compact"><thead><tr><th>received</th><th>event</th><th>value</th><th class="num">lag</th></tr></thead>
      <tbody>${events.map((e, n) => html`<tr key=${events.length - n}><td>${clock(e.at)}</td><td>${e.event}</td>
        <td class="mono">${e.data && "value" in e.data ? short(e.data.value) : ""}</td>
        <td class="num">${e.data?.position ? count(e.data.position.lag_records) : ""}</td></tr>`)}</tbody></table>`}
  </div>`;
}

function Browse({ table, onPick }) {
  const [prefix, setPrefix] = useState("");
  // A cursor belongs to one table and prefix: another one starts from the first page.
  const scope = `${table.name}\u0000${prefix}`;
  const [paging, setPaging] = useState({ scope, cursors: [null] });
  const cursors = paging.scope === scope ? paging.cursors : [null];
  const setCursors = (next) => setPaging({ scope, cursors: next });
  const cursor = cursors[cursors.length - 1];
  const query = new URLSearchParams({ prefix, limit: String(PAGE) });
  if (cursor) query.set("cursor", cursor);
  const { data, error, at } = usePoll(`tables/${segment(table.name)}/keys?${query}`, REFRESH_MS);
  const parts = data?.partitions;
  useFirstPaint("tables", Boolean(data));
  return html`<div class="browse" data-updated=${at} data-items=${data ? data.items.length : 0}>
    <div class="row">
      <label>Keys starting with <input value=${prefix} onInput=${(e) => setPrefix(e.target.value)} placeholder="prefix" /></label>
      <button disabled=${cursors.length === 1} onClick=${() => setCursors(cursors.slice(0, -1))}>Previous</button>
      <button disabled=${!data?.next_cursor} onClick=${() => setCursors([...cursors, data.next_cursor])}>Next</button>
      <span class="muted">page ${cursors.length}</span>
      ${parts && html`<span class="muted">partitions: ${parts.served.length} served${parts.stale.length ? `, ${parts.stale.length} by standbys` : ""}${parts.missing.length ? `, ${parts.missing.length} missing` : ""}</span>`}
    </div>
    <${Problem} error=${error} />
    ${data && html`<table class="keys">
      <thead><tr><th>key</th><th>value</th></tr></thead>
      <tbody>${data.items.map((item) => html`<tr key=${item.key}>
        <td><a href="#/tables" class="key" onClick=${(e) => { e.preventDefault(); onPick(item.key); }}>${item.key}</a></td>
        <td class="mono">${short(item.value)}</td></tr>`)}</tbody></table>`}
  </div>`;
}

export function Tables() {
  const { data, error, at } = usePoll("tables", REFRESH_MS);
  const [chosen, setChosen] = useState(null);
  const [draft, setDraft] = useState("");
  const [key, setKey] = useState(null);
  const tables = data?.tables || [];
  const table = tables.find((t) => t.name === chosen) || tables[0];
  const pick = (name) => {
    setDraft(name);
    setKey(name);
  };
  return html`
    <section class="view" data-view="tables" data-updated=${at}>
      <div class="title"><h2>Tables</h2><${Updated} at=${at} /></div>
      <${Problem} error=${error} />
      ${table && html`
        <form class="row" onSubmit=${(e) => { e.preventDefault(); if (draft) setKey(draft); }}>
          <label>Table <select name="table" value=${table.name} onChange=${(e) => { setChosen(e.target.value); setKey(null); setDraft(""); }}>
            ${tables.map((t) => html`<option value=${t.name}>${t.name} (${t.kind})</option>`)}</select></label>
          <label>Key <input name="key" value=${draft} onInput=${(e) => setDraft(e.target.value)} placeholder="a key" /></label>
          <button type="submit">Look up</button>
          <span class="muted">${table.partitions} partitions, ${table.standby_replicas} standby${table.standby_replicas === 1 ? "" : "s"}, changelog ${table.changelog_topic}</span>
        </form>
        ${key && html`<${Lookup} key=${`${table.name}/${key}`} table=${table} name=${key} />`}
        <h3>Keys</h3>
        <${Browse} table=${table} onPick=${pick} />`}
    </section>`;
}
