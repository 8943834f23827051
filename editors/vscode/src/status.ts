// What the status-bar item shows: server state and the last completion's latency.

export type ServerState = "unknown" | "ready" | "busy" | "error" | "offline" | "disabled";

export interface Status {
  state: ServerState;
  latencyMs?: number; // the last completion's round trip
  message?: string; // the server's error message, or its /ready status
}

export interface StatusView {
  text: string;
  tooltip: string;
  warning: boolean;
}

const ICONS: Record<ServerState, string> = {
  unknown: "$(question)", ready: "$(check)", busy: "$(sync~spin)", error: "$(error)",
  offline: "$(debug-disconnect)", disabled: "$(circle-slash)",
};

export function renderStatus(s: Status, serverUrl: string): StatusView {
  const latency = s.latencyMs === undefined ? "" : ` ${Math.round(s.latencyMs)} ms`;
  const text = `${ICONS[s.state]} nextok${s.state === "ready" || s.state === "busy" ? latency : ""}`;
  const detail = s.message ? `: ${s.message}` : "";
  return {
    text,
    tooltip: `nextok ${s.state}${detail} (${serverUrl})${latency ? `, last completion${latency}` : ""}`,
    warning: s.state === "error" || s.state === "offline",
  };
}

/** The next status: a state without a latency keeps the last known one while the server answers. */
export function nextStatus(prev: Status, s: Status): Status {
  const keep = s.state === "ready" || s.state === "busy";
  return { ...s, latencyMs: s.latencyMs ?? (keep ? prev.latencyMs : undefined) };
}
