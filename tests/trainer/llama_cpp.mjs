// llama_cpp.mjs: llama.cpp itself as the judge of GGUF exports. The model is
// loaded and run by llama.cpp's own library (node-llama-cpp's prebuilt CPU
// build, which scripts/deps.sh installs with npm into .deps/llama-cpp), not by
// a parser of ours:
//
//   node llama_cpp.mjs loss MODEL.gguf TOKENS.bin --windows N --seq T
//       the mean cross-entropy over the first N windows of T tokens of a token
//       file (docs/DATA.md), as `tp-train eval --json` prints it: window w is
//       tokens [w T, w T + T), its targets the next T. Every position's full
//       row of logits comes back from llama.cpp; the log-softmax is taken here
//       in float64.
//   node llama_cpp.mjs generate MODEL.gguf --prompt TEXT --tokens N
//       TEXT and its greedy continuation of N tokens, one byte a token, as
//       `tp-train generate --temperature 0` prints them.
//   node llama_cpp.mjs tokenize MODEL.gguf TEXT_FILE --prepared TOKENS.bin
//       llama.cpp's tokenizer on the text (no BOS added) against the tokens
//       of a token file: exit 0 when equal, 1 naming the first difference.
//
// The context is held at full precision (an fp32 KV cache, no flash
// attention: llama.cpp's defaults keep K and V in fp16) and one token longer
// than a window: node-llama-cpp shifts a context that a window fills, and the
// last position's logits then differ.
//
// Exit status: 0 done, 1 a difference, 2 a usage error, 77 node-llama-cpp is
// not installed (or this Node.js is too old for it): the test says SKIP.
import {existsSync, readFileSync} from "node:fs";
import {dirname, join} from "node:path";
import {fileURLToPath, pathToFileURL} from "node:url";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const PACKAGE = join(ROOT, ".deps", "llama-cpp", "node_modules", "node-llama-cpp", "dist", "index.js");

function fail(code, message) {
    process.stderr.write(`llama_cpp: ${message}\n`);
    process.exit(code);
}

function options(args, names) {
    const found = {};
    const rest = [];
    for (let i = 0; i < args.length; i++) {
        if (names.includes(args[i])) {
            if (i + 1 >= args.length) fail(2, `${args[i]} needs a value`);
            found[args[i].slice(2)] = args[++i];
        } else {
            rest.push(args[i]);
        }
    }
    return [found, rest];
}

// The tokens of a token file: a 1 KiB header (magic 20240520, version 1,
// count), then uint16 ids.
function readTokens(path) {
    const raw = readFileSync(path);
    if (raw.length < 1024) fail(1, `${path}: ${raw.length} bytes, shorter than a token file's 1024-byte header`);
    const magic = raw.readInt32LE(0), version = raw.readInt32LE(4), count = raw.readInt32LE(8);
    if (magic !== 20240520 || version !== 1)
        fail(1, `${path}: magic ${magic} version ${version}, expected 20240520 version 1`);
    if (raw.length !== 1024 + 2 * count)
        fail(1, `${path}: ${raw.length} bytes, the header's ${count} tokens need ${1024 + 2 * count}`);
    const tokens = new Array(count);
    for (let i = 0; i < count; i++) tokens[i] = raw.readUInt16LE(1024 + 2 * i);
    return tokens;
}

async function loadModel(path) {
    const major = Number(process.versions.node.split(".")[0]);
    if (major < 20) fail(77, `node-llama-cpp needs Node.js 20 or later; this is ${process.versions.node}`);
    if (!existsSync(PACKAGE)) fail(77, `node-llama-cpp is not installed (${PACKAGE}; scripts/deps.sh installs it)`);
    const {getLlama, LlamaLogLevel} = await import(pathToFileURL(PACKAGE).href);
    const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
    return await llama.loadModel({modelPath: path});
}

async function sequenceOf(model, length) {
    const context = await model.createContext({
        contextSize: length + 1, batchSize: length + 1, flashAttention: false,
        experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
    });
    return context.getSequence();
}

async function loss(args) {
    const [o, rest] = options(args, ["--windows", "--seq"]);
    if (rest.length !== 2 || !o.windows || !o.seq) fail(2, "usage: loss MODEL.gguf TOKENS.bin --windows N --seq T");
    const windows = Number(o.windows), seq = Number(o.seq);
    const tokens = readTokens(rest[1]);
    if (tokens.length < windows * seq + 1)
        fail(1, `${rest[1]}: ${tokens.length} tokens hold fewer than ${windows} windows of ${seq} (plus one target)`);
    const model = await loadModel(rest[0]);
    const sequence = await sequenceOf(model, seq);
    // The vocabulary: the rows of token_embd (GGUF dimensions [d, vocabulary]).
    const vocabulary = Number(model.fileInfo.fullTensorInfo.find(t => t.name === "token_embd.weight").dimensions[1]);
    let total = 0;
    for (let w = 0; w < windows; w++) {
        const window = tokens.slice(w * seq, w * seq + seq + 1);
        await sequence.clearHistory();
        const out = await sequence.controlledEvaluate(window.slice(0, seq).map(t => [t, {generateNext: {logits: true}}]));
        for (let i = 0; i < seq; i++) {
            const logits = out[i]?.next?.logits;
            if (!logits || logits.size !== vocabulary)
                fail(1, `window ${w} position ${i}: ${logits ? logits.size : "no"} logits from llama.cpp, expected ${vocabulary}`);
            if (!logits.has(window[i + 1])) fail(1, `window ${w} position ${i}: no logit for token ${window[i + 1]}`);
            let max = -Infinity;
            for (const v of logits.values()) max = Math.max(max, v);
            let sum = 0;
            for (const v of logits.values()) sum += Math.exp(v - max);
            total += max + Math.log(sum) - logits.get(window[i + 1]);
        }
    }
    console.log(JSON.stringify({loss: total / (windows * seq), windows, tokens: windows * seq, seq}));
}

async function generate(args) {
    const [o, rest] = options(args, ["--prompt", "--tokens"]);
    if (rest.length !== 1 || o.prompt === undefined || !o.tokens) fail(2, "usage: generate MODEL.gguf --prompt TEXT --tokens N");
    const model = await loadModel(rest[0]);
    const prompt = [...Buffer.from(o.prompt, "utf8")];
    const count = Number(o.tokens);
    const sequence = await sequenceOf(model, prompt.length + count);
    const out = [];
    for await (const token of sequence.evaluate(prompt, {temperature: 0})) {
        out.push(token);
        if (out.length >= count) break;
    }
    process.stdout.write(Buffer.concat([Buffer.from(prompt), Buffer.from(out.map(t => (t < 256 ? t : 63))), Buffer.from("\n")]));
}

async function tokenize(args) {
    const [o, rest] = options(args, ["--prepared"]);
    if (rest.length !== 2 || !o.prepared) fail(2, "usage: tokenize MODEL.gguf TEXT_FILE --prepared TOKENS.bin");
    const expected = readTokens(o.prepared);
    const model = await loadModel(rest[0]);
    const got = model.tokenize(readFileSync(rest[1], "utf8"), false);
    const n = Math.min(got.length, expected.length);
    for (let i = 0; i < n; i++)
        if (got[i] !== expected[i]) fail(1, `token ${i}: llama.cpp ${got[i]}, the token file ${expected[i]}`);
    if (got.length !== expected.length) fail(1, `llama.cpp made ${got.length} tokens, the token file holds ${expected.length}`);
    console.log(`llama.cpp's tokenizer gives the token file's ${n} tokens`);
}

const [command, ...args] = process.argv.slice(2);
const commands = {loss, generate, tokenize};
if (!commands[command]) fail(2, "usage: llama_cpp.mjs loss|generate|tokenize MODEL.gguf ...");
await commands[command](args);
