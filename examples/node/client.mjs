// Stream a generation from a zinfer router with the stock Node libraries:
//
//   npm install zeromq@6 @msgpack/msgpack@3
//   node examples/node/client.mjs tcp://127.0.0.1:5555 "Give me three tips for staying healthy."
//
// The text streams to stdout; the `done` summary goes to stderr. The wire
// protocol is in docs/protocol.md.
import { randomUUID } from "node:crypto";
import { Dealer } from "zeromq";
import { encode, decode } from "@msgpack/msgpack";

const [endpoint = "tcp://127.0.0.1:5555", prompt = "Give me three tips for staying healthy."] = process.argv.slice(2);
const socket = new Dealer({ linger: 0, receiveTimeout: 60_000 });
socket.connect(endpoint);

const id = randomUUID();
await socket.send(encode({
  type: "generate",
  id,
  messages: [{ role: "user", content: prompt }],
  max_tokens: 64,
  temperature: 0,
  stream: true,
}));

try {
  for (;;) {
    const [frame] = await socket.receive(); // throws after receiveTimeout
    const reply = decode(frame);
    if (reply.id !== id) continue;
    if (reply.type === "chunk") {
      process.stdout.write(reply.text);
    } else if (reply.type === "done") {
      process.stdout.write("\n");
      const u = reply.usage;
      console.error(`finish_reason=${reply.finish_reason} prompt_tokens=${u.prompt_tokens} completion_tokens=${u.completion_tokens} worker=${reply.worker}`);
      break;
    } else {
      console.error(`error ${reply.code}: ${reply.message}`);
      process.exitCode = 2;
      break;
    }
  }
} catch (e) {
  console.error(`no reply from ${endpoint}: ${e.message}`);
  process.exitCode = 1;
} finally {
  socket.close();
}
