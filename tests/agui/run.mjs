// Drive agentik's AG-UI endpoint with the real @ag-ui/client: `node run.mjs '<json>'` where the
// JSON is {url, headers?, runs: [{threadId, messages, follow?, context?, tools?, wait?}]}. Runs
// start in order; a run with "wait": false is not awaited before the next one starts, and one
// with "follow": true continues the previous run's messages (a front end's next turn), its
// "messages" appended. Prints, per run,
// {events, messages, raw, error}: the events HttpAgent.runAgent verified and applied, the
// agent's messages after the run, the raw SSE body it read, and the error it threw (if any).
import { HttpAgent } from "@ag-ui/client";

const config = JSON.parse(process.argv[2]);

async function runOne(spec, before) {
  const out = { events: [], messages: [], raw: "", error: null };
  let raw = Promise.resolve("");
  // tee the response body so the exact bytes can be checked by ag-ui-validate too
  const teeFetch = async (url, init) => {
    const response = await fetch(url, init);
    if (!response.body) return response;
    const [mine, theirs] = response.body.tee();
    raw = new Response(mine).text();
    return new Response(theirs, { status: response.status, headers: response.headers });
  };
  const agent = new HttpAgent({
    url: config.url,
    headers: config.headers ?? {},
    threadId: spec.threadId,
    initialMessages: [...(spec.follow ? before.messages : []), ...(spec.messages ?? [])],
    fetch: teeFetch,
  });
  try {
    await agent.runAgent(
      { context: spec.context ?? [], tools: spec.tools ?? [], runId: spec.runId },
      { onEvent: ({ event }) => { out.events.push(event); } },
    );
  } catch (e) {
    out.error = String(e?.message ?? e);
  }
  out.raw = await raw.catch((e) => `read failed: ${e}`);
  out.messages = agent.messages;
  return out;
}

const pending = [];
let last = null;
for (const spec of config.runs) {
  const run = runOne(spec, last);
  pending.push(run);
  if (spec.wait !== false) last = await run;
  else await new Promise((resolve) => setTimeout(resolve, spec.gapMs ?? 300));
}
process.stdout.write(JSON.stringify(await Promise.all(pending)));
