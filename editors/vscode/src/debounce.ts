// Debounce for keystroke-driven requests: a request waits `ms` and goes out only if no newer
// request for the same key (document) came in and its own signal was not aborted meanwhile.

/** Resolves true after `ms`, or false as soon as `signal` aborts. */
export function delay(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const onAbort = () => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

export interface Turn {
  go: boolean; // false: superseded or cancelled while waiting; drop the request
  signal: AbortSignal; // aborts when a newer request for the key comes, or the caller's signal does
  release(): void; // the request finished
}

export class Debouncer {
  private readonly pending = new Map<string, AbortController>();

  constructor(private readonly ms: () => number) {}

  /** Starts a request for `key`, aborting that key's earlier one, and waits the debounce delay. */
  async wait(key: string, outer: AbortSignal): Promise<Turn> {
    this.pending.get(key)?.abort();
    const mine = new AbortController();
    this.pending.set(key, mine);
    const signal = AbortSignal.any([outer, mine.signal]);
    const release = () => {
      if (this.pending.get(key) === mine) this.pending.delete(key);
    };
    const go = await delay(this.ms(), signal);
    return { go: go && !signal.aborted, signal, release };
  }

  /** Keys with a request waiting or in flight. */
  get size(): number {
    return this.pending.size;
  }
}
