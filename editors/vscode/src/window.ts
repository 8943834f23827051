// The text around the cursor that a request carries: a prefix and a suffix bounded by line
// windows, and the completion mode the cursor's context asks for. No `vscode` import: the
// extension adapts its TextDocument to `Lines`.

export interface Lines {
  readonly lineCount: number;
  lineAt(index: number): string; // without its end-of-line
}

export interface Cursor {
  line: number; // 0-based
  character: number; // 0-based, UTF-16 code units (as VS Code and the server count)
}

export interface TextWindow {
  prefix: string;
  suffix: string;
}

export type Mode = "single_line" | "multi_line";

/** Lines [line - prefixLines, line) and the cursor line's head as the prefix; its tail and
 * lines (line, line + suffixLines] as the suffix. Lines are joined with "\n" whatever the file's EOL. */
export function textWindow(doc: Lines, cursor: Cursor, prefixLines: number, suffixLines: number): TextWindow {
  const line = Math.min(Math.max(cursor.line, 0), doc.lineCount - 1);
  const text = doc.lineAt(line);
  const col = Math.min(Math.max(cursor.character, 0), text.length);
  const before: string[] = [];
  for (let i = Math.max(0, line - prefixLines); i < line; i++) before.push(doc.lineAt(i));
  before.push(text.slice(0, col));
  const after: string[] = [text.slice(col)];
  const last = Math.min(doc.lineCount - 1, line + suffixLines);
  for (let i = line + 1; i <= last; i++) after.push(doc.lineAt(i));
  return { prefix: before.join("\n"), suffix: after.join("\n") };
}

// A line ending in one of these opens a block: the body that follows is worth several lines.
const BLOCK_OPENER = /(:|\{|\(|\[|=>|\bthen|\bdo|\bbegin)\s*(#.*|\/\/.*)?$/;

/** Multi-line on a line that holds only indentation (or nothing) right after a block opener;
 * single-line anywhere else, in particular mid-line with code after the cursor. */
export function modeAt(doc: Lines, cursor: Cursor): Mode {
  const text = doc.lineAt(cursor.line);
  if (text.trim() !== "") return "single_line";
  for (let i = cursor.line - 1; i >= 0; i--) {
    const above = doc.lineAt(i);
    if (above.trim() === "") continue;
    return BLOCK_OPENER.test(above.trimEnd()) ? "multi_line" : "single_line";
  }
  return "single_line";
}

/** A plain string as `Lines` (tests, the node integration script). */
export function linesOf(text: string): Lines {
  const lines = text.split(/\r?\n/);
  return { lineCount: lines.length, lineAt: (i) => lines[i] };
}
