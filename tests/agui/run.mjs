// Drive agentik's AG-UI endpoint with the real @ag-ui/client: `node run.mjs '<json>'` where the
// JSON is {url, headers?, runs: [{threadId, messages, follow?, context?, tools?, wait?, answer?,
// toolResults?}]}. Runs start in order; a run with "wait": false is not awaited before the next
// one starts, and one with "follow": true continues the previous run's agent (a front end's next
// run: its messages, its pending interrupts), "messages" appended. "answer" ({status, payload?})
// answers every interrupt the previous run ended with (buildResumeArray: the run's `resume`);
// "toolResults" ({toolName: content}) answers each tool call the previous run left pending with a
// tool message, as a front end that ran its own tool does. Prints, per run,
// {events, messages, raw, error, pendingInterrupts}: the events HttpAgent.runAgent verified and
// applied, the agent's messages after the run, the raw SSE body it read, the error it threw (if
// any), and the interrupts it still has to answer.
import { HttpAgent, buildResumeArray, randomUUID } from "@ag-ui/client";

const config = JSON.parse(process.argv[2]);

function pendingCalls(messages) {
  const answered = new Set(messages.filter((m) => m.role === "tool").map((m) => m.toolCallId));
  return messages
    .filter((m) => m.role === "assistant")
    .flatMap((m) => m.toolCalls ?? [])
    .filter((c) => !answered.has(c.id));
}

async function runOne(spec, before) {
  const out = { events: [], messages: [], raw: "", error: null, pendingInterrupts: [] };
  let raw = Promise.resolve("");
  // tee the response body so the exact bytes can be checked by ag-ui-validate too
  const teeFetch = async (url, init) => {
    const response = await fetch(url, init);
    if (!response.body) return response;
    const [mine, theirs] = response.body.tee();
    raw = new Response(mine).text();
    return new Response(theirs, { status: response.status, headers: response.headers });
  };
  const agent = spec.follow
    ? before.agent
    : new HttpAgent({ url: config.url, headers: config.headers ?? {}, threadId: spec.threadId });
  agent.fetch = teeFetch;
  agent.messages = [...agent.messages, ...(spec.messages ?? [])];
  for (const [name, content] of Object.entries(spec.toolResults ?? {})) {
    for (const call of pendingCalls(agent.messages).filter((c) => c.function.name === name)) {
      agent.messages = [
        ...agent.messages,
        { id: randomUUID(), role: "tool", toolCallId: call.id, content },
      ];
    }
  }
  let resume;
  if (spec.answer) {
    const answers = Object.fromEntries(agent.pendingInterrupts.map((i) => [i.id, spec.answer]));
    resume = buildResumeArray(agent.pendingInterrupts, answers);
  }
  try {
    await agent.runAgent(
      { context: spec.context ?? [], tools: spec.tools ?? [], runId: spec.runId, resume },
      { onEvent: ({ event }) => { out.events.push(event); } },
    );
  } catch (e) {
    out.error = String(e?.message ?? e);
  }
  out.raw = await raw.catch((e) => `read failed: ${e}`);
  out.messages = agent.messages;
  out.pendingInterrupts = agent.pendingInterrupts;
  return { out, agent };
}

const pending = [];
let last = null;
for (const spec of config.runs) {
  const run = runOne(spec, last);
  pending.push(run);
  if (spec.wait !== false) last = await run;
  else await new Promise((resolve) => setTimeout(resolve, spec.gapMs ?? 300));
}
process.stdout.write(JSON.stringify((await Promise.all(pending)).map((r) => r.out)));
