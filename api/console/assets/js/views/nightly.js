// Nightly: the last reconciliation of the tables against the batch recompute, per table
// the keys compared, differing and repaired (GET /nightly every 2 s).
import { REFRESH_MS, useFirstPaint, usePoll } from "../api.js";
import { clock, count, seconds } from "../format.js";
import { html } from "../html.js";
import { Badge, Problem, Updated } from "./common.js";

function Examples({ table }) {
  if (!table.examples?.length) return null;
  return html`<details><summary>${table.examples.length} examples</summary>
    <table class="compact"><thead><tr><th>key</th><th>status</th><th>batch</th><th>stream</th></tr></thead>
    <tbody>${table.examples.map((e, n) => html`<tr key=${n}><td class="mono">${String(e.key)}</td><td>${e.status}</td>
      <td class="mono">${JSON.stringify(e.batch)}</td><td class="mono">${JSON.stringify(e.stream)}</td></tr>`)}</tbody></table>
  </details>`;
}

function Report({ report }) {
  return html`
    <dl class="answer">
      <dt>ran</dt><dd>${clock(report.ran_at)} (offset cut), took ${seconds(report.seconds)}</dd>
      <dt>result</dt><dd>${report.differs ? html`<${Badge} kind="failed">differences found<//>` : html`<${Badge} kind="running">no differences<//>`}
        ${report.corrections_published ? ` ${count(report.corrections_published)} corrections published` : ""}</dd>
      <dt>the workers</dt><dd>${report.cut_settled === false ? "had not caught up with the cut: differences may be records in flight" : "had caught up with the cut"}</dd>
      <dt>report</dt><dd class="mono">${report.path}</dd>
    </dl>
    <table class="nightly">
      <thead><tr><th>table</th><th class="num">keys compared</th><th class="num">differing</th><th class="num">mismatched</th>
        <th class="num">missing in stream</th><th class="num">missing in batch</th><th class="num">repaired</th><th></th></tr></thead>
      <tbody>${report.tables.map((t) => t.recomputed
        ? html`<tr key=${t.name} data-table=${t.name}><td>${t.name}</td><td class="num">${count(t.keys_compared)}</td>
          <td class="num">${count(t.differing)}</td><td class="num">${count(t.mismatched)}</td>
          <td class="num">${count(t.missing_in_stream)}</td><td class="num">${count(t.missing_in_batch)}</td>
          <td class="num">${count(t.repaired)}</td><td><${Examples} table=${t} /></td></tr>`
        : html`<tr key=${t.name} data-table=${t.name}><td>${t.name}</td><td colspan="7" class="muted">not recomputed</td></tr>`)}</tbody>
    </table>`;
}

export function Nightly() {
  const { data, error, at } = usePoll("nightly", REFRESH_MS);
  useFirstPaint("nightly", Boolean(data));
  return html`
    <section class="view" data-view="nightly" data-updated=${at}>
      <div class="title"><h2>Nightly reconciliation</h2><${Updated} at=${at} /></div>
      <${Problem} error=${error} />
      ${data && (data.report
        ? html`<${Report} report=${data.report} />`
        : html`<p class="muted">${data.detail}</p>`)}
    </section>`;
}
