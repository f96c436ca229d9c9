// Topology: every pipeline as a graph from its declaration, records/s on each edge and
// the lag of each topic the pipelines read (GET /topology, every second).
import { useEffect, useMemo, useState } from "preact/hooks";

import { useFirstPaint, usePoll } from "../api.js";
import { count, ms, rate } from "../format.js";
import { html } from "../html.js";
import { Updated, Problem } from "./common.js";

let loading = null;
const loadDagre = () => (loading ??= import("dagre").then((module) => module.default));

const CHAR_PX = 7.2;
const NODE_H = 46;

function nodeWidth(node) {
  return Math.max(110, Math.min(420, node.label.length * CHAR_PX + 28));
}

/** Positions of nodes and edge routes, worked out again only when the graph's shape changes. */
function useLayout(graph) {
  const [layout, setLayout] = useState(null);
  const shape = graph
    ? graph.nodes.map((n) => n.id).join("|") + "#" + graph.edges.map((e) => `${e.from}>${e.to}`).join("|")
    : "";
  useEffect(() => {
    if (!graph) return;
    let cancelled = false;
    loadDagre().then((dagre) => {
      if (cancelled) return;
      const g = new dagre.graphlib.Graph({ multigraph: true });
      g.setGraph({ rankdir: "LR", nodesep: 18, ranksep: 70, marginx: 12, marginy: 12 });
      g.setDefaultEdgeLabel(() => ({}));
      for (const node of graph.nodes) g.setNode(node.id, { width: nodeWidth(node), height: NODE_H });
      graph.edges.forEach((edge, n) => {
        if (g.hasNode(edge.from) && g.hasNode(edge.to)) {
          g.setEdge(edge.from, edge.to, { width: 60, height: 16, labelpos: "c" }, String(n));
        }
      });
      dagre.layout(g);
      const nodes = Object.fromEntries(g.nodes().map((id) => [id, g.node(id)]));
      const edges = Object.fromEntries(g.edges().map((e) => [e.name, g.edge(e)]));
      setLayout({ shape, nodes, edges, width: g.graph().width, height: g.graph().height });
    });
    return () => {
      cancelled = true;
    };
  }, [shape]);
  return layout && layout.shape === shape ? layout : null;
}

function path(points) {
  return points.map((p, n) => `${n ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
}

function Node({ node, at }) {
  const w = at.width;
  const x = at.x - w / 2;
  const y = at.y - NODE_H / 2;
  let detail = node.kind;
  if (node.kind === "table") {
    detail = { internal: "internal state", table: "table" }[node.table_kind] ?? `${node.table_kind} table`;
  }
  if (node.lag_records !== null && node.lag_records !== undefined) {
    detail = `${node.kind} · lag ${count(node.lag_records)} · ${ms(node.lag_ms)}`;
  }
  return html`
    <g class=${`node ${node.kind}`} data-id=${node.id} data-lag=${node.lag_records ?? ""}>
      <title>${node.id}</title>
      <rect x=${x} y=${y} width=${w} height=${NODE_H} rx=${node.kind === "step" ? 4 : 14} />
      <text x=${at.x} y=${at.y - 4} class="label">${node.label}</text>
      <text x=${at.x} y=${at.y + 13} class="detail">${detail}</text>
    </g>`;
}

function Edge({ edge, route }) {
  const mid = route.points[Math.floor(route.points.length / 2)];
  const moving = edge.records_per_s > 0;
  // Idle edges stay unlabelled (grey): the graph reads at a glance where records flow.
  const label = moving ? `${rate(edge.records_per_s)}/s` : "";
  return html`
    <g class=${`edge ${moving ? "moving" : "idle"}`} data-from=${edge.from} data-to=${edge.to}
      data-rate=${edge.records_per_s ?? ""}>
      <path d=${path(route.points)} marker-end="url(#arrow)" />
      ${label && html`<text x=${mid.x} y=${mid.y - 4} class="rate">${label}</text>`}
    </g>`;
}

function Graph({ graph }) {
  const layout = useLayout(graph);
  useFirstPaint("topology", Boolean(layout));
  if (!layout) return html`<p class="loading">Laying out the graph…</p>`;
  return html`
    <svg class="topology" viewBox=${`0 0 ${layout.width} ${layout.height}`}
      width=${layout.width} height=${layout.height} role="img" aria-label="pipeline topology">
      <defs>
        <marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
          <path d="M 0 0 L 10 5 L 0 10 z" />
        </marker>
      </defs>
      ${graph.edges.map((edge, n) => layout.edges[String(n)] && html`<${Edge} key=${n} edge=${edge} route=${layout.edges[String(n)]} />`)}
      ${graph.nodes.map((node) => layout.nodes[node.id] && html`<${Node} key=${node.id} node=${node} at=${layout.nodes[node.id]} />`)}
    </svg>`;
}

function Pipelines({ graph }) {
  const rows = useMemo(() => {
    const found = new Map();
    for (const node of graph.nodes) {
      if (node.kind === "step") found.set(node.pipeline, { name: node.pipeline, read: 0, written: 0, sent: 0 });
    }
    const kinds = Object.fromEntries(graph.nodes.map((n) => [n.id, n.kind]));
    for (const edge of graph.edges) {
      const row = found.get(edge.pipeline);
      if (!row || edge.records_per_s === null) continue;
      if (kinds[edge.to] === "step" && kinds[edge.from] !== "step") row.read += edge.records_per_s;
      else if (kinds[edge.to] === "table") row.written += edge.records_per_s;
      else if (kinds[edge.from] === "step" && kinds[edge.to] !== "step") row.sent += edge.records_per_s;
    }
    return [...found.values()];
  }, [graph]);
  return html`
    <table class="pipelines">
      <thead><tr><th>pipeline</th><th class="num">read/s</th><th class="num">keys written/s</th><th class="num">sent/s</th></tr></thead>
      <tbody>${rows.map((r) => html`<tr key=${r.name}><td>${r.name}</td><td class="num">${rate(r.read)}</td>
        <td class="num">${rate(r.written)}</td><td class="num">${rate(r.sent)}</td></tr>`)}</tbody>
    </table>`;
}

export function Topology() {
  const { data, error, at } = usePoll("topology", 1000);
  return html`
    <section class="view" data-view="topology" data-updated=${at}>
      <div class="title">
        <h2>Topology</h2>
        <${Updated} at=${at} />
      </div>
      <${Problem} error=${error} />
      ${data &&
      html`
        <p class="summary">
          ${`${data.members} member${data.members === 1 ? "" : "s"} reporting; records/s over the last ${rate(data.sampled_over_s)} s`}
          ${data.unreachable.length ? `; not reporting: ${data.unreachable.join(", ")}` : ""}.
        </p>
        <ul class="legend">
          ${["source", "repartition", "step", "table", "output", "dead-letter"].map((k) => html`<li class=${k}>${k}</li>`)}
        </ul>
        <div class="graph"><${Graph} graph=${data} /></div>
        <${Pipelines} graph=${data} />`}
    </section>`;
}
