// Streams one chat completion through usher with the official openai client and prints a JSON
// summary: the number of content chunks, the text, and the usage the client saw; then lists and
// retrieves the models (an unknown one too), and creates embeddings.
// Reads OPENAI_BASE_URL, OPENAI_API_KEY and USHER_MODEL from the environment.
import OpenAI from "openai";

const client = new OpenAI();
const stream = await client.chat.completions.create({
  model: process.env.USHER_MODEL ?? "demo-7b",
  messages: [{ role: "user", content: "Say hello to usher." }],
  max_tokens: 12,
  stream: true,
  stream_options: { include_usage: true },
});
let chunks = 0;
let text = "";
let usage = null;
for await (const chunk of stream) {
  const delta = chunk.choices[0]?.delta?.content;
  if (delta) {
    chunks++;
    text += delta;
  }
  if (chunk.usage) usage = chunk.usage;
}
const model = process.env.USHER_MODEL ?? "demo-7b";
const models = await client.models.list();
const retrieved = await client.models.retrieve(model);
let missingStatus = null;
try {
  await client.models.retrieve("no-such-model");
} catch (err) {
  missingStatus = err.status;
}
const embeddings = await client.embeddings.create({ model, input: ["first text", "second text"] });
console.log(
  JSON.stringify({
    chunks,
    text,
    usage,
    models: models.data.map((m) => m.id),
    retrieved: retrieved.id,
    missingStatus,
    embeddings: embeddings.data.map((d) => d.embedding.length),
    embeddingTokens: embeddings.usage.prompt_tokens,
  }),
);
