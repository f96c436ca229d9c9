// JSX-like templates without a build step: htm bound to Preact's h.
import { h } from "preact";
import htm from "htm";

export const html = htm.bind(h);
