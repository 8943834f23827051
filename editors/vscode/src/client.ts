// HTTP client of nextok's /v1/code/complete: request building, the call (abortable), response
// and error parsing, and a readiness probe. No `vscode` import: the node integration test drives
// this module against a real `nextok serve`.
import type { Mode } from "./window";

export type FetchFn = typeof fetch;

export interface CompleteBody {
  prefix: string;
  suffix: string;
  language: string;
  filepath?: string;
  mode: Mode;
  session_id: string;
  model?: string;
  max_tokens?: number;
  stream: false;
}

export interface RequestInput {
  prefix: string;
  suffix: string;
  language: string;
  filepath?: string;
  mode: Mode;
  sessionId: string;
  model?: string; // "" or undefined: the server's model
  maxTokens?: number; // 0 or undefined: the server's default for the mode
}

export interface Completion {
  text: string;
  finishReason: string | null; // "stop", "length", or "cancelled" when a newer request superseded it
  mode: string;
  latencyMs: number;
}

/** An answer with the server's OpenAI-style error body: `{"error": {"message", "type", ...}}`. */
export class ServerError extends Error {
  constructor(readonly status: number, message: string, readonly type?: string, readonly code?: string | number | null) {
    super(message);
    this.name = "ServerError";
  }
}

export function buildBody(input: RequestInput): CompleteBody {
  const body: CompleteBody = {
    prefix: input.prefix,
    suffix: input.suffix,
    language: input.language,
    mode: input.mode,
    session_id: input.sessionId,
    stream: false,
  };
  if (input.filepath) body.filepath = input.filepath;
  if (input.model) body.model = input.model;
  if (input.maxTokens && input.maxTokens > 0) body.max_tokens = input.maxTokens;
  return body;
}

export function headers(apiKey?: string): Record<string, string> {
  const h: Record<string, string> = { "Content-Type": "application/json", Accept: "application/json" };
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

/** The error of a non-2xx answer: the server's message when the body is its error JSON. */
export function parseError(status: number, text: string): ServerError {
  try {
    const e = JSON.parse(text)?.error;
    if (e && typeof e.message === "string") return new ServerError(status, e.message, e.type, e.code);
  } catch {
    // not JSON: a proxy's page, say
  }
  return new ServerError(status, `HTTP ${status}${text ? `: ${text.slice(0, 200)}` : ""}`);
}

export function parseCompletion(json: unknown, latencyMs: number): Completion {
  const o = json as { completion?: unknown; finish_reason?: unknown; mode?: unknown };
  if (!o || typeof o.completion !== "string") throw new ServerError(200, "malformed response: no completion text");
  return {
    text: o.completion,
    finishReason: typeof o.finish_reason === "string" ? o.finish_reason : null,
    mode: typeof o.mode === "string" ? o.mode : "",
    latencyMs,
  };
}

/** POST /v1/code/complete. Rejects with the fetch's AbortError when `signal` aborts, with a
 * ServerError on an error answer, and with a TypeError when the server cannot be reached. */
export async function complete(
  baseUrl: string,
  body: CompleteBody,
  opts: { apiKey?: string; signal?: AbortSignal; fetch?: FetchFn; now?: () => number } = {},
): Promise<Completion> {
  const doFetch = opts.fetch ?? fetch;
  const now = opts.now ?? (() => performance.now());
  const t0 = now();
  const res = await doFetch(`${baseUrl}/v1/code/complete`, {
    method: "POST",
    headers: headers(opts.apiKey),
    body: JSON.stringify(body),
    signal: opts.signal,
  });
  const text = await res.text();
  if (!res.ok) throw parseError(res.status, text);
  return parseCompletion(JSON.parse(text), now() - t0);
}

export interface Readiness {
  ready: boolean;
  status: string; // "ready", "starting", "draining", "engine_dead", "unreachable", or "HTTP <code>"
  latencyMs: number;
}

/** GET /ready (public: no key needed). */
export async function probe(baseUrl: string, opts: { signal?: AbortSignal; fetch?: FetchFn; now?: () => number } = {}): Promise<Readiness> {
  const doFetch = opts.fetch ?? fetch;
  const now = opts.now ?? (() => performance.now());
  const t0 = now();
  try {
    const res = await doFetch(`${baseUrl}/ready`, { signal: opts.signal });
    let status = `HTTP ${res.status}`;
    try {
      const s = ((await res.json()) as { status?: unknown } | null)?.status;
      if (typeof s === "string") status = s;
    } catch {
      // keep HTTP <code>
    }
    return { ready: res.ok, status, latencyMs: now() - t0 };
  } catch (e) {
    if (isAbort(e)) throw e;
    return { ready: false, status: "unreachable", latencyMs: now() - t0 };
  }
}

export function isAbort(e: unknown): boolean {
  return e instanceof Error && e.name === "AbortError";
}
