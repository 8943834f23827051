// The few parts of the `vscode` API the extension uses, recorded for the tests to inspect.
type Listener<T> = (e: T) => void;

export class EventEmitter<T> {
  private listeners: Listener<T>[] = [];
  event = (l: Listener<T>) => {
    this.listeners.push(l);
    return { dispose: () => (this.listeners = this.listeners.filter((x) => x !== l)) };
  };
  fire(e: T) {
    for (const l of [...this.listeners]) l(e);
  }
}

export class CancellationTokenSource {
  private emitter = new EventEmitter<void>();
  token = {
    isCancellationRequested: false,
    onCancellationRequested: this.emitter.event,
  };
  cancel() {
    if (this.token.isCancellationRequested) return;
    this.token.isCancellationRequested = true;
    this.emitter.fire();
  }
}

export class Position {
  constructor(readonly line: number, readonly character: number) {}
}

export class Range {
  constructor(readonly start: Position, readonly end: Position) {}
}

export class InlineCompletionItem {
  constructor(readonly insertText: string, readonly range?: Range) {}
}

export class ThemeColor {
  constructor(readonly id: string) {}
}

export enum StatusBarAlignment { Left = 1, Right = 2 }

export const state = {
  config: {} as Record<string, unknown>,
  providers: [] as unknown[],
  commands: new Map<string, (...args: unknown[]) => unknown>(),
  statusItems: [] as { text: string; tooltip?: string; shown: boolean }[],
  inputBoxAnswer: undefined as string | undefined,
  configListeners: new EventEmitter<{ affectsConfiguration: (s: string) => boolean }>(),
  closeListeners: new EventEmitter<{ uri: { toString(): string } }>(),
  reset() {
    this.config = {};
    this.providers = [];
    this.commands.clear();
    this.statusItems = [];
    this.inputBoxAnswer = undefined;
  },
};

export const workspace = {
  getConfiguration: (section: string) => ({
    get: (key: string) => state.config[`${section}.${key}`],
  }),
  asRelativePath: (uri: { path: string }) => uri.path.replace(/^\/ws\//, ""),
  onDidChangeConfiguration: state.configListeners.event,
  onDidCloseTextDocument: state.closeListeners.event,
};

export const languages = {
  registerInlineCompletionItemProvider: (_selector: unknown, provider: unknown) => {
    state.providers.push(provider);
    return { dispose() {} };
  },
};

export const commands = {
  registerCommand: (id: string, fn: (...args: unknown[]) => unknown) => {
    state.commands.set(id, fn);
    return { dispose() {} };
  },
};

export const window = {
  createStatusBarItem: () => {
    const item = { text: "", tooltip: undefined as string | undefined, shown: false, command: undefined as unknown,
      backgroundColor: undefined as unknown, show() { item.shown = true; }, dispose() {} };
    state.statusItems.push(item);
    return item;
  },
  showInputBox: async () => state.inputBoxAnswer,
};

/** A TextDocument over a string. */
export function textDocument(text: string, path = "/ws/src/app.py", languageId = "python") {
  const lines = text.split("\n");
  return {
    uri: { scheme: "file", path, toString: () => `file://${path}` },
    languageId,
    lineCount: lines.length,
    lineAt: (i: number) => ({ text: lines[i] }),
  };
}

/** An ExtensionContext with an in-memory SecretStorage. */
export function extensionContext() {
  const secrets = new Map<string, string>();
  return {
    subscriptions: [] as { dispose(): unknown }[],
    secrets: {
      get: async (k: string) => secrets.get(k),
      store: async (k: string, v: string) => void secrets.set(k, v),
      delete: async (k: string) => void secrets.delete(k),
    },
    secretMap: secrets,
  };
}
