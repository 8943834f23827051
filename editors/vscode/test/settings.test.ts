import { describe, expect, it } from "vitest";
import { DEFAULTS, readSettings } from "../src/settings";

const from = (o: Record<string, unknown>) => readSettings((k) => o[k]);

describe("readSettings", () => {
  it("uses the defaults when nothing is set", () => {
    expect(from({})).toEqual(DEFAULTS);
  });
  it("reads every setting", () => {
    expect(from({ enabled: false, serverUrl: " http://gpu:9000/ ", model: "coder", maxTokens: 48,
      completionMode: "multi_line", prefixLines: 10, suffixLines: 2, debounceMs: 300 })).toEqual({
      enabled: false, serverUrl: "http://gpu:9000", model: "coder", maxTokens: 48,
      completionMode: "multi_line", prefixLines: 10, suffixLines: 2, debounceMs: 300 });
  });
  it("falls back on wrong types and clamps out-of-range numbers", () => {
    const s = from({ enabled: "yes", serverUrl: "", maxTokens: 99999, prefixLines: -3, debounceMs: "fast",
      completionMode: "paragraph", suffixLines: 2.7 });
    expect(s.enabled).toBe(true);
    expect(s.serverUrl).toBe(DEFAULTS.serverUrl);
    expect(s.maxTokens).toBe(4096);
    expect(s.prefixLines).toBe(0);
    expect(s.suffixLines).toBe(2);
    expect(s.debounceMs).toBe(DEFAULTS.debounceMs);
    expect(s.completionMode).toBe("auto");
  });
});
