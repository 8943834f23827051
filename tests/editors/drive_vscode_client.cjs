// Drives the VS Code extension's compiled request code (no `vscode` in it) against a real
// nextok server and prints one JSON object for tests/server/test_vscode_client.py to check.
// usage: node drive_vscode_client.cjs OUT_DIR SERVER_URL API_KEY
const path = require("node:path");

const [outDir, url, apiKey] = process.argv.slice(2);
const client = require(path.join(outDir, "client.js"));
const { Completer } = require(path.join(outDir, "completer.js"));
const { DEFAULTS } = require(path.join(outDir, "settings.js"));
const { linesOf } = require(path.join(outDir, "window.js"));

const settled = (p) => p.then((v) => ({ ok: true, v }), (e) => ({ ok: false, name: e.name, status: e.status, message: e.message }));

async function main() {
  const result = { ms: {} };
  const t0 = performance.now();
  const lap = (name) => (result.ms[name] = Math.round(performance.now() - t0));
  result.probe = await client.probe(url);

  // The extension's whole path: debounce, window, mode, session id, status.
  const statuses = [];
  const completer = new Completer({
    settings: () => ({ ...DEFAULTS, serverUrl: url, debounceMs: 20, maxTokens: 24 }),
    apiKey: async () => apiKey,
    onStatus: (s) => statuses.push(s),
    instance: "it",
  });
  const text = "import math\n\n\ndef area_of_circle(radius):\n    return ";
  const lines = linesOf(text);
  const cursor = { line: lines.lineCount - 1, character: lines.lineAt(lines.lineCount - 1).length };
  const doc = { key: "file:///ws/geometry.py", lines, cursor, languageId: "python", filepath: "geometry.py" };
  result.completion = await completer.provide(doc, new AbortController().signal);
  result.statuses = statuses;
  lap("completion");

  // The editor cancels mid-request: the fetch rejects with an AbortError.
  const body = client.buildBody({ prefix: "def fibonacci(n):\n    ", suffix: "", language: "python", mode: "multi_line",
    sessionId: "it-abort", maxTokens: 256 });
  const abort = new AbortController();
  const pending = settled(client.complete(url, body, { apiKey, signal: abort.signal }));
  setTimeout(() => abort.abort(), 5); // sent, and far from 256 tokens
  result.aborted = await pending;
  lap("aborted");

  // A wrong key: the server's error message comes through.
  result.badKey = await settled(client.complete(url, { ...body, session_id: "it-bad", max_tokens: 4 }, { apiKey: "sk-wrong" }));
  result.noKey = await settled(client.complete(url, { ...body, session_id: "it-none", max_tokens: 4 }, {}));
  lap("errors");
  return result;
}

main().then(
  (r) => console.log(JSON.stringify(r)),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
