// Dead letters: the latest records of each dead-letter topic with their reason and where
// they came from; select some and replay them to their source topic, once each
// (GET /dead-letters every 2 s, POST /dead-letters/replay).
import { useState } from "preact/hooks";

import { REFRESH_MS, request, useFirstPaint, usePoll } from "../api.js";
import { bytes, clock, count } from "../format.js";
import { html } from "../html.js";
import { Badge, Problem, Updated } from "./common.js";

const name = (r) => `${r.topic}/${r.partition}/${r.offset}`;

function ReplayState({ replay }) {
  if (!replay) return html`<span class="muted">not replayed</span>`;
  const to = replay.to ? ` → ${replay.to.topic}[${replay.to.partition}]@${replay.to.offset}` : "";
  const kinds = { replayed: "running", "dead-lettered": "recovering", claimed: "rebalancing", failed: "failed" };
  return html`<${Badge} kind=${kinds[replay.status] || "idle"}>${replay.status}<//>
    <span class="muted">${to}${replay.by ? ` by ${replay.by}` : ""}</span>`;
}

function Results({ outcome }) {
  if (!outcome) return null;
  if (outcome.error) {
    const refused = outcome.error.body?.refused || [];
    return html`<div class="error" role="alert" data-outcome="refused">
      <p>${outcome.error.status}: ${outcome.error.detail}</p>
      ${refused.length > 0 && html`<ul>${refused.map((r) => html`<li>${name(r)}: ${r.replay?.status} by ${r.replay?.by}</li>`)}</ul>`}
    </div>`;
  }
  return html`<div class="results" role="status" data-outcome="done">
    <ul>${outcome.results.map((r) => html`<li key=${name(r)}>${name(r)}: <strong>${r.status}</strong>
      ${r.to ? ` to ${r.to.topic}[${r.to.partition}]@${r.to.offset}` : ""}${r.detail ? ` (${r.detail})` : ""}</li>`)}</ul>
  </div>`;
}

export function DeadLetters() {
  const [topic, setTopic] = useState(null);
  const [selected, setSelected] = useState(new Set());
  const [busy, setBusy] = useState(false);
  const [outcome, setOutcome] = useState(null);
  const query = new URLSearchParams({ limit: "100" });
  if (topic) query.set("topic", topic);
  const { data, error, at } = usePoll(`dead-letters?${query}`, REFRESH_MS);
  useFirstPaint("dead-letters", Boolean(data));
  const toggle = (key) => {
    const next = new Set(selected);
    next.has(key) ? next.delete(key) : next.add(key);
    setSelected(next);
  };
  const replay = async () => {
    const records = [...selected].map((key) => {
      const [t, p, o] = key.split("/");
      return { topic: t, partition: Number(p), offset: Number(o) };
    });
    setBusy(true);
    try {
      setOutcome(await request("dead-letters/replay", { method: "POST", body: { records } }));
      setSelected(new Set());
    } catch (failure) {
      setOutcome({ error: failure });
    } finally {
      setBusy(false);
    }
  };
  const topics = data?.topics || [];
  return html`
    <section class="view" data-view="dead-letters" data-updated=${at}>
      <div class="title"><h2>Dead letters</h2><${Updated} at=${at} /></div>
      <${Problem} error=${error} />
      ${data && html`
        <ul class="chips">
          <li><button class=${topic ? "" : "on"} onClick=${() => setTopic(null)}>all</button></li>
          ${topics.map((t) => html`<li key=${t.topic}><button class=${t.topic === topic ? "on" : ""} data-topic=${t.topic}
            onClick=${() => setTopic(t.topic)}>${t.topic} <span class="count">${count(t.records)}</span></button></li>`)}
        </ul>
        <div class="row">
          <button class="primary" disabled=${!selected.size || busy} onClick=${replay}>
            Replay ${selected.size || ""} selected to their source topics</button>
          <span class="muted">Replay after the fix is deployed: each record goes back once, with a <code>replayed-from</code> header; a record still invalid goes back to its dead-letter topic.</span>
        </div>
        <${Results} outcome=${outcome} />
        ${data.records.length === 0
          ? html`<p class="muted">No dead letters${topic ? ` in ${topic}` : ""}.</p>`
          : html`<table class="dead-letters">
          <thead><tr><th></th><th>time</th><th>dead letter</th><th>reason</th><th>from</th><th>key</th><th>value</th><th>replay</th></tr></thead>
          <tbody>${data.records.map((r) => html`<tr key=${name(r)} data-record=${name(r)}>
            <td><input type="checkbox" aria-label=${`select ${name(r)}`} disabled=${Boolean(r.replay)}
              checked=${selected.has(name(r))} onChange=${() => toggle(name(r))} /></td>
            <td>${clock(r.timestamp)}</td>
            <td class="mono">${r.topic}[${r.partition}]@${r.offset}</td>
            <td class="reason">${r.error ?? "–"}${r.replayed_from ? html`<br /><span class="muted">replay of ${r.replayed_from}</span>` : ""}</td>
            <td class="mono">${r.source.topic ?? "?"}[${r.source.partition ?? "?"}]@${r.source.offset ?? "?"}</td>
            <td class="mono">${bytes(r.key)}</td>
            <td class="mono value">${bytes(r.value)}</td>
            <td><${ReplayState} replay=${r.replay} /></td></tr>`)}</tbody></table>`}`}
    </section>`;
}
