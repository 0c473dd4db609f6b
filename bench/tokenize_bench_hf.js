// HF tokenizers peer for bench/tokenize_bench.cc: the same corpus through HF's official Node
// binding (npm "tokenizers", the Rust library of the Python package). Single-threaded: run with
// TOKENIZERS_PARALLELISM=false so encodeBatch tokenizes the documents one after another on one
// thread (no per-call JS overhead counted); per-call encode() is reported too.
//
// setup (once; node_modules stays under the ignored .cache/):
//   npm install --prefix .cache/hf-node tokenizers@0.23.2
// usage:
//   TOKENIZERS_PARALLELISM=false NODE_PATH=.cache/hf-node/node_modules \
//     node bench/tokenize_bench_hf.js TOKENIZER.json CORPUS.jsonl [repeat]
const { Tokenizer } = require('tokenizers');
const fs = require('fs');

(async () => {
  const [file, corpus, repeatArg] = process.argv.slice(2);
  const repeat = Number(repeatArg || 5);
  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(file);
  const loadS = Number(process.hrtime.bigint() - t0) / 1e9;
  const docs = fs.readFileSync(corpus, 'utf8').split('\n').filter(l => l.length).map(l => {
    const j = JSON.parse(l);
    return typeof j === 'string' ? j : (j.text !== undefined ? j.text : j.document);
  });
  const bytes = docs.reduce((n, d) => n + Buffer.byteLength(d, 'utf8'), 0);
  let tokens = 0;
  for (const e of await tok.encodeBatch(docs, { addSpecialTokens: false })) tokens += e.getIds().length;
  const best = async (fn) => {
    let b = 1e30;
    for (let r = 0; r < repeat; r++) {
      const t = process.hrtime.bigint();
      await fn();
      b = Math.min(b, Number(process.hrtime.bigint() - t) / 1e9);
    }
    return b;
  };
  const batch = await best(() => tok.encodeBatch(docs, { addSpecialTokens: false }));
  const single = await best(async () => {
    for (const d of docs) await tok.encode(d, null, { addSpecialTokens: false });
  });
  const mb = bytes / 1e6;
  console.log(`hf   load ${loadS.toFixed(2)}s  docs ${docs.length}  ${mb.toFixed(2)} MB  ${tokens} tokens`);
  console.log(`hf   encodeBatch (TOKENIZERS_PARALLELISM=${process.env.TOKENIZERS_PARALLELISM}): ${(mb / batch).toFixed(2)} MB/s  ${(tokens / batch).toFixed(0)} tokens/s`);
  console.log(`hf   encode per doc: ${(mb / single).toFixed(2)} MB/s  ${(tokens / single).toFixed(0)} tokens/s`);
})();
