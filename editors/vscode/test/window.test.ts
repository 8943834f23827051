import { describe, expect, it } from "vitest";
import { linesOf, modeAt, textWindow } from "../src/window";

const doc = linesOf(["l0", "l1", "l2", "def f(x):", "    return x + 1", "l5", "l6", "l7"].join("\n"));

describe("textWindow", () => {
  it("splits the cursor line at the cursor", () => {
    const w = textWindow(doc, { line: 4, character: 11 }, 100, 100);
    expect(w.prefix).toBe("l0\nl1\nl2\ndef f(x):\n    return ");
    expect(w.suffix).toBe("x + 1\nl5\nl6\nl7");
    expect(w.prefix + w.suffix).toBe(["l0", "l1", "l2", "def f(x):", "    return x + 1", "l5", "l6", "l7"].join("\n"));
  });

  it("bounds the prefix and the suffix by line windows", () => {
    const w = textWindow(doc, { line: 4, character: 4 }, 2, 1);
    expect(w.prefix).toBe("l2\ndef f(x):\n    ");
    expect(w.suffix).toBe("return x + 1\nl5");
  });

  it("sends only the cursor line with zero-line windows", () => {
    expect(textWindow(doc, { line: 4, character: 4 }, 0, 0)).toEqual({ prefix: "    ", suffix: "return x + 1" });
  });

  it("clamps a cursor past the line's end or the document's", () => {
    expect(textWindow(doc, { line: 0, character: 99 }, 5, 0)).toEqual({ prefix: "l0", suffix: "" });
    expect(textWindow(doc, { line: 99, character: 0 }, 1, 5).prefix).toBe("l6\n");
  });

  it("reads CRLF text and counts UTF-16 code units as VS Code does", () => {
    const w = textWindow(linesOf("a = '😀b'\r\nc"), { line: 0, character: 7 }, 5, 5);
    expect(w).toEqual({ prefix: "a = '😀", suffix: "b'\nc" });
  });
});

describe("modeAt", () => {
  const at = (text: string, line: number) => modeAt(linesOf(text), { line, character: 0 });
  it("is multi-line on an indented empty line after a block opener", () => {
    expect(at("def f(x):\n    ", 1)).toBe("multi_line");
    expect(at("function f() {\n\n", 1)).toBe("multi_line");
    expect(at("if x:  # comment\n\n   ", 2)).toBe("multi_line");
  });
  it("is single-line mid-line and after a finished statement", () => {
    expect(modeAt(linesOf("x = foo(1)"), { line: 0, character: 4 })).toBe("single_line");
    expect(at("x = 1\n    ", 1)).toBe("single_line");
    expect(at("", 0)).toBe("single_line");
  });
});
