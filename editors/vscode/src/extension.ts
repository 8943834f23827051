// The thin `vscode` layer: settings, the secret API key, the inline-completion provider and the
// status-bar item. The request logic lives in modules that do not import `vscode`.
import * as vscode from "vscode";
import { probe } from "./client";
import { Completer } from "./completer";
import { API_KEY_SECRET, readSettings, SECTION, Settings } from "./settings";
import { nextStatus, renderStatus, Status } from "./status";
import type { Lines } from "./window";

export function currentSettings(): Settings {
  const cfg = vscode.workspace.getConfiguration(SECTION);
  return readSettings((key) => cfg.get(key));
}

function linesOf(doc: vscode.TextDocument): Lines {
  return { lineCount: doc.lineCount, lineAt: (i) => doc.lineAt(i).text };
}

export class NextokProvider implements vscode.InlineCompletionItemProvider {
  constructor(private readonly completer: Completer) {}

  async provideInlineCompletionItems(
    document: vscode.TextDocument,
    position: vscode.Position,
    _context: vscode.InlineCompletionContext,
    token: vscode.CancellationToken,
  ): Promise<vscode.InlineCompletionItem[] | undefined> {
    const abort = new AbortController();
    if (token.isCancellationRequested) return undefined;
    const sub = token.onCancellationRequested(() => abort.abort());
    try {
      const text = await this.completer.provide(
        {
          key: document.uri.toString(),
          lines: linesOf(document),
          cursor: { line: position.line, character: position.character },
          languageId: document.languageId,
          filepath: document.uri.scheme === "file" ? vscode.workspace.asRelativePath(document.uri, false) : undefined,
        },
        abort.signal,
      );
      if (text === undefined || token.isCancellationRequested) return undefined;
      return [new vscode.InlineCompletionItem(text, new vscode.Range(position, position))];
    } finally {
      sub.dispose();
    }
  }
}

export function activate(context: vscode.ExtensionContext): { completer: Completer; status: () => Status } {
  const item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  item.command = "nextok.checkServer";
  let status: Status = { state: "unknown" };
  const show = (s: Status) => {
    status = nextStatus(status, s);
    const view = renderStatus(status, currentSettings().serverUrl);
    item.text = view.text;
    item.tooltip = view.tooltip;
    item.backgroundColor = view.warning ? new vscode.ThemeColor("statusBarItem.warningBackground") : undefined;
  };
  const completer = new Completer({
    settings: currentSettings,
    apiKey: async () => (await context.secrets.get(API_KEY_SECRET)) || undefined,
    onStatus: show,
  });
  const check = async () => {
    const s = currentSettings();
    if (!s.enabled) return show({ state: "disabled" });
    const r = await probe(s.serverUrl);
    show(r.ready ? { state: "ready" } : { state: r.status === "unreachable" ? "offline" : "error", message: r.status });
  };
  context.subscriptions.push(
    item,
    vscode.languages.registerInlineCompletionItemProvider({ pattern: "**" }, new NextokProvider(completer)),
    vscode.commands.registerCommand("nextok.setApiKey", async () => {
      const key = await vscode.window.showInputBox({
        prompt: "nextok API key (empty to remove it)", password: true, ignoreFocusOut: true,
      });
      if (key === undefined) return;
      if (key.trim()) await context.secrets.store(API_KEY_SECRET, key.trim());
      else await context.secrets.delete(API_KEY_SECRET);
      await check();
    }),
    vscode.commands.registerCommand("nextok.checkServer", check),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration(SECTION)) void check();
    }),
    vscode.workspace.onDidCloseTextDocument((doc) => completer.forget(doc.uri.toString())),
  );
  show({ state: "unknown" });
  item.show();
  void check();
  return { completer, status: () => status };
}

export function deactivate(): void {}
