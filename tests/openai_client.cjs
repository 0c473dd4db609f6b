// The official `openai` JavaScript client against `deg serve`, unchanged: one structured-output
// request plain and one streamed (ServerTest.OpenAiClientGetsStructuredAnswers runs this).
//   node openai_client.cjs OPENAI_PACKAGE_DIR BASE_URL API_KEY SCHEMA_FILE DOCUMENT_FILE
// Prints {"plain": content, "finish_reason", "id", "streamed": content joined from the chunks}.
const fs = require("fs");
const [dir, baseURL, apiKey, schemaFile, documentFile] = process.argv.slice(2);
const OpenAI = require(dir).default;

async function main() {
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  const request = {
    model: "tiny",
    messages: [
      { role: "system", content: "Fill the schema from the document." },
      { role: "user", content: fs.readFileSync(documentFile, "utf8") },
    ],
    response_format: {
      type: "json_schema",
      json_schema: { name: "invoice", schema: JSON.parse(fs.readFileSync(schemaFile, "utf8")) },
    },
  };
  const plain = await client.chat.completions.create(request);
  let streamed = "";
  for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
    streamed += chunk.choices[0]?.delta?.content ?? "";
  }
  console.log(JSON.stringify({
    plain: plain.choices[0].message.content,
    finish_reason: plain.choices[0].finish_reason,
    id: plain.id,
    streamed,
  }));
}

main().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
