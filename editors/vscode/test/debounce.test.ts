import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Debouncer, delay } from "../src/debounce";

beforeEach(() => vi.useFakeTimers());
afterEach(() => vi.useRealTimers());

describe("delay", () => {
  it("resolves true after the delay", async () => {
    const p = delay(100, new AbortController().signal);
    await vi.advanceTimersByTimeAsync(100);
    await expect(p).resolves.toBe(true);
  });
  it("resolves false at once when aborted, and when already aborted", async () => {
    const c = new AbortController();
    const p = delay(100, c.signal);
    c.abort();
    await expect(p).resolves.toBe(false);
    await expect(delay(100, c.signal)).resolves.toBe(false);
  });
});

describe("Debouncer", () => {
  it("lets only the last of quick successive requests of a document through", async () => {
    const d = new Debouncer(() => 150);
    const outer = new AbortController().signal;
    const first = d.wait("doc", outer);
    await vi.advanceTimersByTimeAsync(50);
    const second = d.wait("doc", outer);
    await vi.advanceTimersByTimeAsync(50);
    const third = d.wait("doc", outer);
    await vi.advanceTimersByTimeAsync(149);
    expect((await first).go).toBe(false);
    expect((await second).go).toBe(false);
    let done = false;
    void third.then(() => (done = true));
    await vi.advanceTimersByTimeAsync(0);
    expect(done).toBe(false); // 149 ms: still waiting
    await vi.advanceTimersByTimeAsync(1);
    const t = await third;
    expect(t.go).toBe(true);
    expect((await first).signal.aborted).toBe(true); // a superseded request's fetch aborts too
    expect(t.signal.aborted).toBe(false);
    t.release();
    expect(d.size).toBe(0);
  });

  it("keeps documents apart", async () => {
    const d = new Debouncer(() => 10);
    const outer = new AbortController().signal;
    const a = d.wait("a", outer);
    const b = d.wait("b", outer);
    await vi.advanceTimersByTimeAsync(10);
    expect((await a).go).toBe(true);
    expect((await b).go).toBe(true);
  });

  it("drops a request whose caller cancels while it waits", async () => {
    const d = new Debouncer(() => 100);
    const c = new AbortController();
    const p = d.wait("doc", c.signal);
    c.abort();
    const t = await p;
    expect(t.go).toBe(false);
    expect(t.signal.aborted).toBe(true);
  });

  it("a released old request does not forget a newer one", async () => {
    const d = new Debouncer(() => 0);
    const outer = new AbortController().signal;
    const old = d.wait("doc", outer);
    const newer = d.wait("doc", outer);
    await vi.advanceTimersByTimeAsync(0);
    (await old).release();
    expect(d.size).toBe(1);
    (await newer).release();
    expect(d.size).toBe(0);
  });
});
