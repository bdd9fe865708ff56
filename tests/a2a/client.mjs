// The @a2a-js/sdk client against an agentik server: node client.mjs BASE_URL [API_KEY]
// Sends (blocking), streams in the same context, gets and lists; prints what it saw as JSON.
import { ClientFactory } from "@a2a-js/sdk/client";

const [base, key] = process.argv.slice(2);
const text = (parts) => parts.map((p) => (p.content?.$case === "text" ? p.content.value : "")).join("");
const message = (words, contextId = "") => ({
  message: {
    messageId: crypto.randomUUID(),
    contextId,
    taskId: "",
    role: 1, // ROLE_USER
    parts: [{ content: { $case: "text", value: words }, metadata: undefined, filename: "", mediaType: "" }],
    metadata: undefined,
    extensions: [],
    referenceTaskIds: [],
  },
});

if (key) {
  const plain = globalThis.fetch;
  globalThis.fetch = (url, init = {}) => {
    const headers = new Headers(init.headers);
    if (String(url).includes("/a2a/") && !String(url).includes("agent-card")) {
      headers.set("Authorization", `Bearer ${key}`);
    }
    return plain(url, { ...init, headers });
  };
}

const client = await new ClientFactory().createFromUrl(`${base}/a2a`);
const out = {};
const sent = await client.sendMessage(message("hello js"));
out.sent = { state: sent.status.state, text: text(sent.artifacts[0].parts), contextId: sent.contextId,
  conversationId: sent.metadata?.agentikConversationId, id: sent.id };
const events = [];
for await (const event of client.sendMessageStream(message("stream js", sent.contextId))) {
  events.push(event);
}
out.stream = {
  kinds: events.map((e) => e.payload.$case),
  text: events.filter((e) => e.payload.$case === "artifactUpdate").map((e) => text(e.payload.value.artifact.parts)).join(""),
  last: events.at(-1).payload.value.status?.state,
  id: events[0].payload.value.id,
};
const got = await client.getTask({ tenant: "", id: out.stream.id, historyLength: undefined });
out.got = { state: got.status.state, text: text(got.artifacts[0].parts) };
const listed = await client.listTasks({ tenant: "", contextId: sent.contextId, pageSize: 10, pageToken: "",
  historyLength: undefined, statusTimestampAfter: undefined, includeArtifacts: false, status: 0 });
out.listed = { ids: listed.tasks.map((t) => t.id), total: listed.totalSize };
try {
  await client.getTask({ tenant: "", id: "no-such-task", historyLength: undefined });
} catch (e) {
  out.missing = { name: e.constructor.name, message: String(e.message) };
}
console.log(JSON.stringify(out));
