// One inline-completion request from keystroke to text: debounce, the text window, the mode,
// the request with the document's session id, and the outcome reported to the status bar.
import { buildBody, complete, FetchFn, isAbort, ServerError } from "./client";
import { Debouncer } from "./debounce";
import type { Settings } from "./settings";
import type { Status } from "./status";
import { Cursor, Lines, modeAt, textWindow } from "./window";

export interface DocumentInput {
  key: string; // the document's URI: debounce and session id are per document
  lines: Lines;
  cursor: Cursor;
  languageId: string;
  filepath?: string;
}

export interface CompleterDeps {
  settings: () => Settings;
  apiKey: () => Promise<string | undefined>;
  onStatus: (s: Status) => void;
  fetch?: FetchFn;
  now?: () => number;
  instance?: string; // distinguishes this editor window's session ids from another's
}

export class Completer {
  private readonly debouncer: Debouncer;
  private readonly sessions = new Map<string, string>();
  private readonly instance: string;

  constructor(private readonly deps: CompleterDeps) {
    this.debouncer = new Debouncer(() => deps.settings().debounceMs);
    this.instance = deps.instance ?? Math.random().toString(36).slice(2, 10);
  }

  /** One id per document: the server cancels a document's running completion when the next
   * keystroke's request arrives, even before the editor's cancellation reaches it. */
  sessionId(key: string): string {
    let id = this.sessions.get(key);
    if (id === undefined) {
      id = `vscode-${this.instance}-${this.sessions.size + 1}`;
      this.sessions.set(key, id);
    }
    return id;
  }

  forget(key: string): void {
    this.sessions.delete(key);
  }

  /** The text to show at the cursor, or undefined: disabled, superseded, cancelled, failed or empty. */
  async provide(doc: DocumentInput, cancel: AbortSignal): Promise<string | undefined> {
    const settings = this.deps.settings();
    if (!settings.enabled) return undefined;
    const turn = await this.debouncer.wait(doc.key, cancel);
    try {
      if (!turn.go) return undefined;
      const { prefix, suffix } = textWindow(doc.lines, doc.cursor, settings.prefixLines, settings.suffixLines);
      const mode = settings.completionMode === "auto" ? modeAt(doc.lines, doc.cursor) : settings.completionMode;
      const body = buildBody({
        prefix, suffix, mode, language: doc.languageId, filepath: doc.filepath, sessionId: this.sessionId(doc.key),
        model: settings.model, maxTokens: settings.maxTokens,
      });
      this.deps.onStatus({ state: "busy" });
      const apiKey = await this.deps.apiKey();
      const result = await complete(settings.serverUrl, body, { apiKey, signal: turn.signal, fetch: this.deps.fetch, now: this.deps.now });
      this.deps.onStatus({ state: "ready", latencyMs: result.latencyMs });
      if (turn.signal.aborted || result.finishReason === "cancelled" || result.finishReason === "abort") return undefined;
      return result.text.length > 0 ? result.text : undefined;
    } catch (e) {
      if (isAbort(e) || turn.signal.aborted) {
        this.deps.onStatus({ state: "ready" });
        return undefined;
      }
      if (e instanceof ServerError) this.deps.onStatus({ state: "error", message: e.message });
      else this.deps.onStatus({ state: "offline", message: e instanceof Error ? e.message : String(e) });
      return undefined;
    } finally {
      turn.release();
    }
  }
}
