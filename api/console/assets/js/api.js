// Requests to the worker that serves the page, and nothing else. With a bearer token
// (STREAMSTATE_API_TOKEN on the workers) the page keeps it in sessionStorage for this tab
// and sends it as the Authorization header of every request it makes.
import { useEffect, useRef, useState } from "preact/hooks";

const TOKEN_KEY = "streamstate.console.token";
/** How often the views that are not about rates ask again (the rates' views: every second). */
export const REFRESH_MS = 1000;
// The API's routes sit beside /ui/ on the same worker.
const BASE = new URL("../", document.baseURI);

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY),
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

const listeners = new Set();
/** Called with true when the worker refused the token (or its absence). */
export function onUnauthorized(listener) {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

export class ApiError extends Error {
  constructor(status, detail, body) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
    this.body = body;
  }
}

export function apiUrl(path) {
  return new URL(path, BASE).toString();
}

function headers(extra = {}) {
  const found = { Accept: "application/json", ...extra };
  const bearer = token.get();
  if (bearer) found.Authorization = `Bearer ${bearer}`;
  return found;
}

/** A path segment as the API expects it: dots escaped too, so "." and ".." survive. */
export function segment(text) {
  return encodeURIComponent(text).replaceAll(".", "%2E");
}

/** An answer the page asked for before the modules ran, if it is one wanted (once). */
function takeEarly(path, method) {
  const early = window.streamstateEarly;
  if (!early || method !== "GET" || early.bearer !== token.get()) return null;
  const answer = Object.hasOwn(early.answers, path) ? early.answers[path] : null;
  if (!answer) return null;
  delete early.answers[path];
  return answer;
}

export async function request(path, { method = "GET", body, signal } = {}) {
  const options = { method, signal, headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body !== undefined) options.body = JSON.stringify(body);
  const answer = await (takeEarly(path, method) ?? fetch(apiUrl(path), options));
  const text = await answer.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (answer.status === 401) listeners.forEach((listener) => listener(true));
  if (!answer.ok) {
    const detail = data && typeof data === "object" && data.detail ? data.detail : answer.statusText;
    throw new ApiError(answer.status, detail, data);
  }
  return data;
}

/** Whether the workers want a token: the page says so. */
export function tokenRequired() {
  return document.querySelector('meta[name="streamstate-token-required"]')?.content === "true";
}

/**
 * GET ``path`` now and then every ``everyMs`` (not while the tab is hidden): the latest
 * answer, the error of the latest attempt, and when the latest answer came.
 */
export function usePoll(path, everyMs) {
  const [state, setState] = useState({ data: null, error: null, at: 0, path });
  useEffect(() => {
    if (!path) return undefined;
    let stopped = false;
    let timer = null;
    const controller = new AbortController();
    setState((s) => (s.path === path ? s : { data: null, error: null, at: 0, path }));
    const tick = async () => {
      const started = performance.now();
      if (!document.hidden) {
        try {
          const data = await request(path, { signal: controller.signal });
          if (!stopped) setState({ data, error: null, at: Date.now(), path });
        } catch (error) {
          if (!stopped && error.name !== "AbortError") setState((s) => ({ ...s, error }));
        }
      }
      if (!stopped) timer = setTimeout(tick, Math.max(50, everyMs - (performance.now() - started)));
    };
    tick();
    return () => {
      stopped = true;
      clearTimeout(timer);
      controller.abort();
    };
  }, [path, everyMs]);
  return state;
}

/** Marks the first time a view showed the worker's figures (read by the browser tests). */
export function useFirstPaint(view, ready) {
  const marked = useRef(false);
  useEffect(() => {
    if (ready && !marked.current) {
      marked.current = true;
      performance.mark(`streamstate:${view}`);
    }
  }, [ready]);
}

/**
 * Follow a server-sent event stream with fetch (EventSource cannot send a bearer token):
 * ``onEvent(event, data, id)`` per event. Reconnects with Last-Event-ID when the stream
 * ends (on a rebalance it ends with "moved"). Returns a function that stops it.
 */
export function follow(path, onEvent, onState) {
  const controller = new AbortController();
  let lastId = null;
  const run = async () => {
    while (!controller.signal.aborted) {
      try {
        onState("connecting");
        const extra = { Accept: "text/event-stream" };
        if (lastId) extra["Last-Event-ID"] = lastId;
        const answer = await fetch(apiUrl(path), { headers: headers(extra), signal: controller.signal });
        if (answer.status === 401) listeners.forEach((listener) => listener(true));
        if (!answer.ok) {
          const body = await answer.json().catch(() => ({}));
          onState(`refused: ${answer.status} ${body.detail || ""}`);
          return;
        }
        onState("following");
        await readEvents(answer.body, (event, data, id) => {
          if (id) lastId = id;
          onEvent(event, data, id);
        });
        onState("reconnecting");
      } catch (error) {
        if (controller.signal.aborted) return;
        onState(`reconnecting after ${error.message}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 500));
    }
  };
  run();
  return () => controller.abort();
}

async function readEvents(body, emit) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      let id = null;
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = text;
        else if (field === "id") id = text;
        else if (field === "data") data.push(text);
      }
      if (data.length || event !== "message") {
        let parsed = null;
        try {
          parsed = data.length ? JSON.parse(data.join("\n")) : null;
        } catch {
          parsed = data.join("\n");
        }
        emit(event, parsed, id);
      }
    }
  }
}
