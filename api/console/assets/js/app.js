// The console's shell: the views' navigation (by the URL's fragment) and the token entry.
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";

import { onUnauthorized, token, tokenRequired } from "./api.js";
import { Topology } from "./views/topology.js";
import { Group } from "./views/group.js";
import { Tables } from "./views/tables.js";
import { DeadLetters } from "./views/deadletters.js";
import { Nightly } from "./views/nightly.js";
import { html } from "./html.js";

const VIEWS = [
  ["topology", "Topology", Topology],
  ["group", "Group", Group],
  ["tables", "Tables", Tables],
  ["dead-letters", "Dead letters", DeadLetters],
  ["nightly", "Nightly", Nightly],
];

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
  const [, , View] = VIEWS.find(([id]) => id === view);
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
        : html`<${View} />`}
    </main>`;
}

const root = document.getElementById("app");
root.textContent = ""; // the "Loading" line the page shows until the modules run
render(html`<${App} />`, root);
