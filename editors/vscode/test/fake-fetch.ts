// A fetch that records requests and answers from a handler; it rejects with an AbortError when
// the request's signal aborts, as the real fetch does.
export interface Call {
  url: string;
  init: RequestInit;
  body: Record<string, unknown>;
  signal?: AbortSignal;
}

export function fakeFetch(answer: (call: Call) => Promise<Response> | Response) {
  const calls: Call[] = [];
  const fn = (async (url: string, init: RequestInit = {}) => {
    const call = { url, init, body: init.body ? JSON.parse(init.body as string) : {}, signal: init.signal ?? undefined };
    calls.push(call);
    const abort = new Promise<never>((_, reject) => {
      const fail = () => reject(new DOMException("This operation was aborted", "AbortError"));
      if (call.signal?.aborted) fail();
      call.signal?.addEventListener("abort", fail, { once: true });
    });
    return Promise.race([Promise.resolve(answer(call)), abort]);
  }) as unknown as typeof fetch;
  return { fn, calls };
}

export const json = (status: number, body: unknown) =>
  new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });

export const never = () => new Promise<Response>(() => {});
