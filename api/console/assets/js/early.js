// The first answer the opening view waits for, asked for while the page's modules still
// load: the view's first paint then waits for the slower of the two, not for one after
// the other. A classic script without imports, so that it runs as soon as it arrives;
// `request` in api.js takes its answer over once, for the same path and token.
(() => {
  const FIRST = { topology: "topology", group: "group", tables: "tables", nightly: "nightly" };
  const OTHERS = ["dead-letters"]; // its first request depends on the view's state
  const view = location.hash.replace(/^#\/?/, "").split("?")[0];
  const path = FIRST[view] ?? (OTHERS.includes(view) ? null : "topology");
  const required =
    document.querySelector('meta[name="streamstate-token-required"]')?.content === "true";
  const bearer = sessionStorage.getItem("streamstate.console.token");
  if (!path || (required && !bearer)) return;
  const headers = { Accept: "application/json" };
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  const answer = fetch(new URL(`../${path}`, document.baseURI), { headers });
  answer.catch(() => {}); // a failure is the view's to report, when it takes the answer
  window.streamstateEarly = { path, bearer, answer };
})();
