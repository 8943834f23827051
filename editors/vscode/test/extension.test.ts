// The provider and extension through the fake `vscode` module (aliased in vitest.config.mts).
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import * as vscode from "vscode";
import { Completer } from "../src/completer";
import { activate, currentSettings, NextokProvider } from "../src/extension";
import { CancellationTokenSource, extensionContext, state, textDocument } from "./fake-vscode";
import { fakeFetch, json, never } from "./fake-fetch";

const fake = vscode as unknown as typeof import("./fake-vscode");

function provider(answer: Parameters<typeof fakeFetch>[0], apiKey?: string) {
  const f = fakeFetch(answer);
  const statuses: unknown[] = [];
  const completer = new Completer({
    settings: currentSettings, apiKey: async () => apiKey, onStatus: (s) => statuses.push(s), fetch: f.fn, instance: "t",
  });
  return { p: new NextokProvider(completer), f, statuses };
}

const ask = (p: NextokProvider, doc: ReturnType<typeof textDocument>, line: number, ch: number, token = new CancellationTokenSource().token) =>
  p.provideInlineCompletionItems(doc as never, new fake.Position(line, ch) as never, {} as never, token as never);

beforeEach(() => {
  state.reset();
  state.config["nextok.debounceMs"] = 0;
  state.config["nextok.serverUrl"] = "http://gpu:8000/";
});
afterEach(() => vi.useRealTimers());

describe("NextokProvider", () => {
  it("sends the window, language, path, mode and session id, and returns an item at the cursor", async () => {
    state.config["nextok.prefixLines"] = 1;
    state.config["nextok.model"] = "coder";
    state.config["nextok.maxTokens"] = 40;
    const { p, f, statuses } = provider(() => json(200, { completion: "return x", finish_reason: "stop" }), "sk-9");
    const doc = textDocument("import os\ndef f(x):\n    \nprint(f(1))");
    const items = await ask(p, doc, 2, 4);
    expect(items).toHaveLength(1);
    expect(items![0].insertText).toBe("return x");
    expect((items![0].range as unknown as { start: { line: number; character: number } }).start).toMatchObject({ line: 2, character: 4 });
    expect(f.calls[0].url).toBe("http://gpu:8000/v1/code/complete");
    expect(f.calls[0].body).toEqual({
      prefix: "def f(x):\n    ", suffix: "\nprint(f(1))", language: "python", filepath: "src/app.py",
      mode: "multi_line", session_id: "vscode-t-1", model: "coder", max_tokens: 40, stream: false,
    });
    expect((f.calls[0].init.headers as Record<string, string>).Authorization).toBe("Bearer sk-9");
    expect(statuses.at(-1)).toMatchObject({ state: "ready" });
  });

  it("asks single-line mid-line, and keeps one session id per document", async () => {
    const { p, f } = provider(() => json(200, { completion: "1)", finish_reason: "stop" }));
    const a = textDocument("x = f(", "/ws/a.py");
    const b = textDocument("y = g(", "/ws/b.py");
    await ask(p, a, 0, 6);
    await ask(p, b, 0, 6);
    await ask(p, a, 0, 6);
    expect(f.calls.map((c) => c.body.mode)).toEqual(["single_line", "single_line", "single_line"]);
    expect(f.calls.map((c) => c.body.session_id)).toEqual(["vscode-t-1", "vscode-t-2", "vscode-t-1"]);
  });

  it("aborts the fetch when the editor cancels the token, and shows nothing", async () => {
    const { p, f } = provider(never);
    const cts = new CancellationTokenSource();
    const pending = ask(p, textDocument("x = "), 0, 4, cts.token);
    await vi.waitFor(() => expect(f.calls).toHaveLength(1));
    cts.cancel();
    await expect(pending).resolves.toBeUndefined();
    expect(f.calls[0].signal?.aborted).toBe(true);
  });

  it("debounces: a keystroke within the delay supersedes the previous request before it is sent", async () => {
    vi.useFakeTimers();
    state.config["nextok.debounceMs"] = 100;
    const { p, f } = provider(() => json(200, { completion: "ok", finish_reason: "stop" }));
    const first = ask(p, textDocument("x = 1"), 0, 5);
    await vi.advanceTimersByTimeAsync(60);
    const second = ask(p, textDocument("x = 12"), 0, 6);
    await vi.advanceTimersByTimeAsync(100);
    expect(await first).toBeUndefined();
    expect((await second)![0].insertText).toBe("ok");
    expect(f.calls).toHaveLength(1);
    expect(f.calls[0].body.prefix).toBe("x = 12");
  });

  it("drops a completion the server cancelled for a newer one, and reports server errors", async () => {
    const cancelled = provider(() => json(200, { completion: "partial", finish_reason: "cancelled" }));
    expect(await ask(cancelled.p, textDocument("x"), 0, 1)).toBeUndefined();
    const bad = provider(() => json(401, { error: { message: "incorrect API key", type: "authentication_error" } }));
    expect(await ask(bad.p, textDocument("x"), 0, 1)).toBeUndefined();
    expect(bad.statuses.at(-1)).toEqual({ state: "error", message: "incorrect API key" });
  });

  it("asks nothing when disabled", async () => {
    state.config["nextok.enabled"] = false;
    const { p, f } = provider(() => json(200, { completion: "x" }));
    expect(await ask(p, textDocument("x"), 0, 1)).toBeUndefined();
    expect(f.calls).toHaveLength(0);
  });
});

describe("activate", () => {
  it("registers the provider and commands, stores the API key in secret storage, and shows the server state", async () => {
    const probes: string[] = [];
    vi.stubGlobal("fetch", async (url: string) => {
      probes.push(url);
      return json(200, { status: "ready" });
    });
    try {
      const ctx = extensionContext();
      const api = activate(ctx as never);
      expect(state.providers).toHaveLength(1);
      expect([...state.commands.keys()]).toEqual(expect.arrayContaining(["nextok.setApiKey", "nextok.checkServer"]));
      const item = state.statusItems[0];
      expect(item.shown).toBe(true);
      await vi.waitFor(() => expect(api.status().state).toBe("ready"));
      expect(item.text).toContain("nextok");
      expect(probes[0]).toBe("http://gpu:8000/ready");

      state.inputBoxAnswer = " sk-secret ";
      await state.commands.get("nextok.setApiKey")!();
      expect(ctx.secretMap.get("nextok.apiKey")).toBe("sk-secret");
      state.inputBoxAnswer = "";
      await state.commands.get("nextok.setApiKey")!();
      expect(ctx.secretMap.has("nextok.apiKey")).toBe(false);

      api.completer["deps"].onStatus({ state: "ready", latencyMs: 87.4 });
      expect(item.text).toBe("$(check) nextok 87 ms");
      api.completer["deps"].onStatus({ state: "offline", message: "fetch failed" });
      expect(item.tooltip).toContain("offline: fetch failed");
    } finally {
      vi.unstubAllGlobals();
    }
  });
});
