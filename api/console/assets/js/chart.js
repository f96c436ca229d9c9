// A time chart (uPlot, loaded when a view first shows one).
import { useEffect, useRef } from "preact/hooks";

import { html } from "./html.js";

let loading = null;
// uPlot and its stylesheet load with the first chart: the views without one do not wait.
const load = () =>
  (loading ??= Promise.all([
    import("uplot"),
    new Promise((resolve) => {
      const sheet = Object.assign(document.createElement("link"), {
        rel: "stylesheet",
        href: new URL("../vendor/uplot/uPlot.min.css", import.meta.url).toString(),
      });
      sheet.addEventListener("load", resolve);
      sheet.addEventListener("error", resolve);
      document.head.append(sheet);
    }),
  ]).then(([module]) => module.default));

const COLOURS = ["#2563eb", "#db2777", "#16a34a", "#ea580c", "#7c3aed", "#0891b2", "#ca8a04"];

/**
 * ``times``: epoch seconds; ``series``: [{label, values}] as long as ``times``.
 * ``bars``: draw each point as a bar (windows) instead of a line.
 */
export function Chart({ times, series, height = 180, bars = false, label = "", span = null }) {
  const box = useRef(null);
  const plot = useRef(null);
  const shape = series.map((s) => s.label).join("\u0000");
  useEffect(() => {
    let cancelled = false;
    load().then((uPlot) => {
      if (cancelled || !box.current) return;
      const paths = bars ? uPlot.paths.bars({ size: [0.8, 40] }) : undefined;
      const options = {
        width: Math.max(240, box.current.clientWidth),
        height,
        legend: { live: false },
        cursor: { show: true, drag: { x: false, y: false } },
        scales: { x: span ? { time: true, range: () => span } : { time: true } },
        axes: [{}, { size: 60 }],
        series: [
          {},
          ...series.map((s, n) => ({
            label: s.label,
            stroke: COLOURS[n % COLOURS.length],
            fill: bars ? `${COLOURS[n % COLOURS.length]}55` : undefined,
            width: 1.5,
            spanGaps: true,
            paths,
            points: { show: bars ? false : times.length < 3 },
          })),
        ],
      };
      plot.current?.destroy();
      plot.current = new uPlot(options, [times, ...series.map((s) => s.values)], box.current);
    });
    return () => {
      cancelled = true;
    };
  }, [shape, bars, height, span?.[0], span?.[1]]);
  useEffect(() => {
    plot.current?.setData([times, ...series.map((s) => s.values)]);
  }, [times, series]);
  useEffect(() => {
    const resized = () => plot.current?.setSize({ width: Math.max(240, box.current.clientWidth), height });
    addEventListener("resize", resized);
    return () => {
      removeEventListener("resize", resized);
      plot.current?.destroy();
      plot.current = null;
    };
  }, []);
  return html`<div class="chart" ref=${box} aria-label=${label} data-points=${times.length}></div>`;
}
