// Pieces every view shows: when its figures were updated, and what went wrong.
import { useEffect, useState } from "preact/hooks";

import { clock } from "../format.js";
import { html } from "../html.js";

export function Updated({ at }) {
  const [, tick] = useState(0);
  useEffect(() => {
    const timer = setInterval(() => tick((n) => n + 1), 1000);
    return () => clearInterval(timer);
  }, []);
  const age = at ? Math.max(0, (Date.now() - at) / 1000) : null;
  const stale = age !== null && age > 5;
  return html`<span class=${`updated ${stale ? "stale" : ""}`} title=${at ? clock(at) : ""}>
    ${at ? `updated ${age < 1 ? "just now" : `${age.toFixed(0)} s ago`}` : "waiting for the worker…"}</span>`;
}

export function Problem({ error }) {
  if (!error) return null;
  const text = error.status ? `The worker answered ${error.status}: ${error.detail}` : `No answer from the worker: ${error.message}`;
  return html`<p class="error" role="alert">${text}</p>`;
}

export function Badge({ kind, children }) {
  return html`<span class=${`badge ${kind}`}>${children}</span>`;
}
