// The console's shell: the views' navigation (by the URL's fragment) and the token entry.
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";

import { onUnauthorized, token, tokenRequired } from "./api.js";
import { html } from "./html.js";

// Each view's module loads when the view is first opened (the page preloads the opening
// one's): a view's first paint does not wait for the others' code.
const VIEWS = [
  ["topology", "Topology", () => import("./views/topology.js").then((m) => m.Topology)],
  ["group", "Group", () => import("./views/group.js").then((m) => m.Group)],
  ["tables", "Tables", () => import("./views/tables.js").then((m) => m.Tables)],
  ["dead-letters", "Dead letters", () => import("./views/deadletters.js").then((m) => m.DeadLetters)],
  ["nightly", "Nightly", () => import("./views/nightly.js").then((m) => m.Nightly)],
];
const loaded = new Map(); // view name -> its component, once its module has loaded

function currentView() {
  const name = location.hash.replace(/^#\/?/, "").split("?")[0];
  return VIEWS.some(([id]) => id === name) ? name : "topology";
}

function TokenForm({ refused, onDone }) {
  const [value, setValue] = useState("");
  const submit = (event) => {
    event.preventDefault();
    if (!value.trim()) return;
    token.set(value.trim());
    onDone();
  };
  return html`
    <form class="token" onSubmit=${submit}>
      <h2>This worker wants a bearer token</h2>
      <p>
        The workers run with <code>STREAMSTATE_API_TOKEN</code>. The token is kept in this tab
        only (sessionStorage) and sent as the <code>Authorization</code> header.
      </p>
      ${refused && html`<p class="error" role="alert">The worker refused that token.</p>`}
      <label>Token <input type="password" name="token" autocomplete="off" value=${value}
        onInput=${(e) => setValue(e.target.value)} /></label>
      <button type="submit">Open the console</button>
    </form>`;
}

function App() {
  const [view, setView] = useState(currentView());
  const [needsToken, setNeedsToken] = useState(tokenRequired() && !token.get());
  const [refused, setRefused] = useState(false);
  useEffect(() => {
    const moved = () => setView(currentView());
    addEventListener("hashchange", moved);
    return () => removeEventListener("hashchange", moved);
  }, []);
  useEffect(() =>
    onUnauthorized(() => {
      token.clear();
      setRefused(true);
      setNeedsToken(true);
    }), []);
  const [, , load] = VIEWS.find(([id]) => id === view);
  const [, setLoads] = useState(0);
  const [failed, setFailed] = useState(null);
  useEffect(() => {
    setFailed(null); // another view's failure is not this one's
    if (loaded.has(view)) return;
    load().then(
      (component) => { loaded.set(view, component); setLoads((n) => n + 1); },
      (error) => setFailed(`The ${view} view did not load: ${error.message}`),
    );
  }, [view]);
  const View = loaded.get(view);
  return html`
    <header>
      <h1>streamstate <span>console</span></h1>
      <nav>
        ${VIEWS.map(
          ([id, label]) => html`<a href=${`#/${id}`} class=${id === view ? "active" : ""}
            aria-current=${id === view ? "page" : null}>${label}</a>`,
        )}
      </nav>
      <span class="worker">worker ${location.host}</span>
      ${token.get() &&
      html`<button class="link" onClick=${() => { token.clear(); setRefused(false); setNeedsToken(true); }}>
        Forget token</button>`}
    </header>
    <main id=${`view-${view}`}>
      ${needsToken
        ? html`<${TokenForm} refused=${refused} onDone=${() => { setRefused(false); setNeedsToken(false); }} />`
        : View
          ? html`<${View} />`
          : html`<p class=${failed ? "error" : "loading"} role=${failed ? "alert" : null}>
              ${failed ?? "Loading the view…"}</p>`}
    </main>`;
}

// The page adds this module from its head: it may run before the body is parsed.
function start() {
  const root = document.getElementById("app");
  root.textContent = ""; // the "Loading" line the page shows until the modules run
  render(html`<${App} />`, root);
}
if (document.readyState === "loading") addEventListener("DOMContentLoaded", start, { once: true });
else start();
