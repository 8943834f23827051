// nextok playground: Monaco with inline completions from /v1/code/complete.
// One session_id per page: the server cancels a session's older request when a newer one comes,
// and the page aborts its own in-flight fetch on every keystroke (AbortController).
"use strict";

const DEBOUNCE_MS = 150;
const KEY_STORAGE = "nextok.apiKey";
const LANGUAGES = {  // Monaco language id -> sample file name (the server's filepath hint)
  python: "main.py", javascript: "main.js", typescript: "main.ts", go: "main.go", rust: "main.rs",
  c: "main.c", cpp: "main.cpp", java: "Main.java", csharp: "Program.cs", php: "index.php",
  ruby: "main.rb", lua: "main.lua", shell: "run.sh", sql: "query.sql", html: "index.html",
};
const SAMPLES = { python: "import math\n\n", javascript: "// utilities\n\n", go: "package main\n\n" };

const $ = (id) => document.getElementById(id);
const sessionId = "playground-" + Math.random().toString(36).slice(2, 10);
const state = { inflight: null, auth: false, history: [], last: null };
window.nextokPlayground = state;  // for tests and the console

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

function apiHeaders() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function abortInflight() {
  if (state.inflight) state.inflight.abort();
  state.inflight = null;
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
});

async function complete(model, position, token) {
  abortInflight();
  const ctrl = new AbortController();
  state.inflight = ctrl;
  token.onCancellationRequested(() => ctrl.abort());
  await sleep(DEBOUNCE_MS, ctrl.signal);
  if (ctrl.signal.aborted) return null;
  const end = model.getFullModelRange().getEndPosition();
  const language = model.getLanguageId();
  const body = {
    prefix: model.getValueInRange(new monaco.Range(1, 1, position.lineNumber, position.column)),
    suffix: model.getValueInRange(new monaco.Range(position.lineNumber, position.column, end.lineNumber, end.column)),
    language, filepath: LANGUAGES[language], mode: "auto", session_id: sessionId,
  };
  const t0 = performance.now();
  setStatus("completing…");
  try {
    const r = await fetch("/v1/code/complete", { method: "POST", headers: apiHeaders(), body: JSON.stringify(body), signal: ctrl.signal });
    const json = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error((json.error && json.error.message) || "HTTP " + r.status);
    const ms = Math.round(performance.now() - t0);
    if (json.finish_reason === "cancelled") return null;  // a newer request of this session won
    state.last = { text: json.completion, ms, tokens: json.usage.completion_tokens, mode: json.mode };
    state.history = [ms, ...state.history].slice(0, 5);
    setStatus(`${json.completion ? "completion" : "no completion"}: ${ms} ms, ${json.usage.completion_tokens} tokens, ${json.mode}`);
    $("history").textContent = "recent: " + state.history.map((m) => m + " ms").join(" · ");
    return json.completion || null;
  } catch (e) {
    if (e.name !== "AbortError") setStatus("error: " + e.message, true);
    return null;
  } finally {
    if (state.inflight === ctrl) state.inflight = null;
  }
}

function setupControls(editor) {
  const picker = $("language");
  for (const id of Object.keys(LANGUAGES)) picker.add(new Option(id, id));
  picker.value = "python";
  picker.onchange = () => {
    monaco.editor.setModelLanguage(editor.getModel(), picker.value);
    if (!editor.getValue().trim()) editor.setValue(SAMPLES[picker.value] || "");
    editor.focus();
  };
  const key = $("api-key");
  key.value = localStorage.getItem(KEY_STORAGE) || "";
  key.oninput = () => localStorage.setItem(KEY_STORAGE, key.value.trim());
  fetch("/playground/config.json").then((r) => r.json()).then((c) => {
    state.auth = c.auth;
    $("key-label").hidden = !c.auth;
    setStatus(`ready: model ${c.model}` + (c.auth && !key.value ? " (enter an API key)" : ""));
  }).catch(() => setStatus("cannot reach the server", true));
}

// Monaco rejects its own superseded inline-completion promises with a CancellationError
// ("Canceled") that nothing awaits (microsoft/monaco-editor#4554, #4767): a keystroke during a
// slow completion surfaced it as an unhandled rejection in the page. A cancellation is the
// expected outcome there, so that one error is not reported; every other still is.
window.addEventListener("unhandledrejection", (e) => {
  if (e.reason && e.reason.name === "Canceled" && e.reason.message === "Canceled") e.preventDefault();
});

require.config({ paths: { vs: "/playground/vs" } });
require(["vs/editor/editor.main"], () => {
  const editor = monaco.editor.create($("editor"), {
    value: SAMPLES.python, language: "python", theme: "vs-dark", automaticLayout: true,
    fontSize: 14, minimap: { enabled: false }, inlineSuggest: { enabled: true },
  });
  state.editor = editor;
  monaco.languages.registerInlineCompletionsProvider({ pattern: "**" }, {
    async provideInlineCompletions(model, position, _context, token) {
      const text = await complete(model, position, token);
      if (!text || token.isCancellationRequested) return { items: [] };
      const at = new monaco.Range(position.lineNumber, position.column, position.lineNumber, position.column);
      return { items: [{ insertText: text, range: at }] };
    },
    freeInlineCompletions() {},
  });
  editor.onDidChangeModelContent(abortInflight);  // every keystroke drops the stale request
  setupControls(editor);
  editor.setPosition(editor.getModel().getFullModelRange().getEndPosition());
  editor.focus();
});
