// The extension's settings, read through a getter so that tests need no `vscode`.

export type ModeSetting = "auto" | "single_line" | "multi_line";

export interface Settings {
  enabled: boolean;
  serverUrl: string; // no trailing slash
  model: string; // "" = the server's model
  maxTokens: number; // 0 = the server's default for the mode
  completionMode: ModeSetting;
  prefixLines: number;
  suffixLines: number;
  debounceMs: number;
}

export const DEFAULTS: Settings = {
  enabled: true,
  serverUrl: "http://127.0.0.1:8000",
  model: "",
  maxTokens: 0,
  completionMode: "auto",
  prefixLines: 100,
  suffixLines: 30,
  debounceMs: 150,
};

export const SECTION = "nextok";
export const API_KEY_SECRET = "nextok.apiKey";

/** `get(key)` returns the raw value of `nextok.<key>` (undefined when unset). Wrong types and
 * out-of-range numbers fall back to the default or are clamped, so a bad setting never throws. */
export function readSettings(get: (key: string) => unknown): Settings {
  const bool = (k: keyof Settings) => (typeof get(k) === "boolean" ? (get(k) as boolean) : (DEFAULTS[k] as boolean));
  const str = (k: keyof Settings) => (typeof get(k) === "string" ? (get(k) as string).trim() : (DEFAULTS[k] as string));
  const int = (k: keyof Settings, lo: number, hi: number) => {
    const v = get(k);
    if (typeof v !== "number" || !Number.isFinite(v)) return DEFAULTS[k] as number;
    return Math.min(hi, Math.max(lo, Math.floor(v)));
  };
  const mode = get("completionMode");
  return {
    enabled: bool("enabled"),
    serverUrl: (str("serverUrl") || DEFAULTS.serverUrl).replace(/\/+$/, ""),
    model: str("model"),
    maxTokens: int("maxTokens", 0, 4096),
    completionMode: mode === "single_line" || mode === "multi_line" || mode === "auto" ? mode : "auto",
    prefixLines: int("prefixLines", 0, 10000),
    suffixLines: int("suffixLines", 0, 10000),
    debounceMs: int("debounceMs", 0, 5000),
  };
}
