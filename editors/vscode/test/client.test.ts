import { describe, expect, it } from "vitest";
import { buildBody, complete, parseError, probe, ServerError } from "../src/client";
import { fakeFetch, json, never } from "./fake-fetch";

const input = { prefix: "def f(", suffix: ")\n", language: "python", mode: "single_line" as const, sessionId: "s1" };

describe("request building", () => {
  it("sends the /v1/code/complete fields, leaving out unset model and max_tokens", () => {
    expect(buildBody({ ...input, filepath: "src/a.py", model: "", maxTokens: 0 })).toEqual({
      prefix: "def f(", suffix: ")\n", language: "python", filepath: "src/a.py", mode: "single_line",
      session_id: "s1", stream: false,
    });
    const b = buildBody({ ...input, model: "coder", maxTokens: 32 });
    expect(b.model).toBe("coder");
    expect(b.max_tokens).toBe(32);
    expect("filepath" in b).toBe(false);
  });

  it("posts JSON with the key as a bearer token", async () => {
    const f = fakeFetch(() => json(200, { completion: "x):", finish_reason: "stop", mode: "single_line" }));
    let t = 0;
    const r = await complete("http://h:1", buildBody(input), { apiKey: "sk-1", fetch: f.fn, now: () => (t += 40) });
    expect(r).toEqual({ text: "x):", finishReason: "stop", mode: "single_line", latencyMs: 40 });
    expect(f.calls[0].url).toBe("http://h:1/v1/code/complete");
    expect(f.calls[0].init.method).toBe("POST");
    expect((f.calls[0].init.headers as Record<string, string>).Authorization).toBe("Bearer sk-1");
    expect(f.calls[0].body.session_id).toBe("s1");
  });

  it("sends no Authorization header without a key", async () => {
    const f = fakeFetch(() => json(200, { completion: "" }));
    await complete("http://h:1", buildBody(input), { fetch: f.fn });
    expect("Authorization" in (f.calls[0].init.headers as object)).toBe(false);
  });
});

describe("response parsing", () => {
  it("turns the server's error body into a ServerError with its message", async () => {
    const f = fakeFetch(() => json(401, { error: { message: "incorrect API key", type: "authentication_error", param: null, code: "invalid_api_key" } }));
    const err = await complete("http://h", buildBody(input), { fetch: f.fn }).catch((e) => e);
    expect(err).toBeInstanceOf(ServerError);
    expect(err).toMatchObject({ status: 401, message: "incorrect API key", type: "authentication_error", code: "invalid_api_key" });
  });
  it("keeps a non-JSON error readable", () => {
    expect(parseError(502, "<html>bad gateway</html>").message).toBe("HTTP 502: <html>bad gateway</html>");
    expect(parseError(503, "").message).toBe("HTTP 503");
  });
  it("rejects a body without completion text", async () => {
    const f = fakeFetch(() => json(200, { choices: [] }));
    await expect(complete("http://h", buildBody(input), { fetch: f.fn })).rejects.toThrow(/malformed/);
  });
});

describe("cancellation", () => {
  it("aborts the fetch when the signal aborts", async () => {
    const f = fakeFetch(never);
    const c = new AbortController();
    const p = complete("http://h", buildBody(input), { fetch: f.fn, signal: c.signal });
    c.abort();
    await expect(p).rejects.toMatchObject({ name: "AbortError" });
    expect(f.calls[0].signal?.aborted).toBe(true);
  });
});

describe("probe", () => {
  it("reports /ready's status, and unreachable on a network error", async () => {
    expect(await probe("http://h", { fetch: fakeFetch(() => json(200, { status: "ready" })).fn })).toMatchObject({ ready: true, status: "ready" });
    expect(await probe("http://h", { fetch: fakeFetch(() => json(503, { status: "draining" })).fn })).toMatchObject({ ready: false, status: "draining" });
    const down = fakeFetch(() => Promise.reject(new TypeError("fetch failed")));
    expect(await probe("http://h", { fetch: down.fn })).toMatchObject({ ready: false, status: "unreachable" });
  });
});
