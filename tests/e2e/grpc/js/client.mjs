// A gRPC client of mop written with grpc-js, Node's own gRPC implementation, so that the
// end-to-end tests check mop against a client that shares no code with grpcio or with mop.
//
// It loads the .proto mop ships (nothing is generated ahead of time), runs one request given
// as JSON in its first argument and prints one JSON object with what happened:
//
//   node client.mjs '{"target": "127.0.0.1:50051", "method": "produce",
//                     "metadata": {"pulsar-topic": "t"}, "sends": [{"payload": "aGk="}]}'
//
// Methods:
//   produce  streams every Send of "sends" on one call (honouring the stream's back-pressure),
//            half-closes, prints {"results": [SendResult...], "status": {...}}
//   send     one unary call per Send, prints {"results": [...], "status": {...}} (the status
//            of the last call)
//   consume  reads "count" messages, acknowledges them as "ack" says ("individual",
//            "cumulative", "negative" or "none"), half-closes, prints
//            {"messages": [Message...], "status": {...}}
// With "tls": {"ca": PEM file[, "cert": PEM file, "key": PEM file]} the client connects over
// TLS, trusting that CA, and presents the certificate when given (mTLS).
// Payloads are base64 in both directions; int64 fields are decimal strings. A call that ends
// with a status other than OK is still a normal run (exit code 0): the status is the result.
// The exit code is 2 when the request itself is malformed, 3 on timeout ("timeout_ms").

import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PROTO = path.resolve(HERE, "../../../../mop/protocols/grpc/proto/mop_grpc.proto");

function loadService() {
  const definition = protoLoader.loadSync(PROTO, {
    keepCase: true,
    longs: String,
    enums: String,
    bytes: String, // base64 on output
    defaults: true,
    oneofs: true,
  });
  return grpc.loadPackageDefinition(definition).mop.grpc.v1.PulsarGrpcService;
}

function credentialsOf(tls) {
  if (tls === undefined) return grpc.credentials.createInsecure();
  const read = (file) => (file === undefined ? null : readFileSync(file));
  return grpc.credentials.createSsl(read(tls.ca), read(tls.key), read(tls.cert));
}

function metadataOf(pairs) {
  const metadata = new grpc.Metadata();
  for (const [key, value] of Object.entries(pairs ?? {})) {
    metadata.add(key, String(value));
  }
  return metadata;
}

function sendOf(spec) {
  return {
    payload: Buffer.from(spec.payload ?? "", "base64"),
    key: spec.key,
    properties: (spec.properties ?? []).map(([key, value]) => ({ key, value })),
    event_time: String(spec.event_time ?? 0),
    deliver_at_time: String(spec.deliver_at_time ?? 0),
    sequence_id: String(spec.sequence_id ?? 0),
  };
}

function statusOf(status) {
  return { code: status.code, details: status.details ?? "" };
}

function errorStatus(error) {
  return { code: error.code ?? grpc.status.UNKNOWN, details: error.details ?? String(error) };
}

// Writes every Send, waiting for "drain" when the stream's buffer is full, so that the
// server's HTTP/2 flow control paces the client instead of node's memory absorbing it.
async function writeAll(call, sends) {
  for (const spec of sends) {
    if (!call.write(sendOf(spec))) {
      await new Promise((resolve) => call.once("drain", resolve));
    }
  }
  call.end();
}

function produce(client, request) {
  return new Promise((resolve) => {
    const results = [];
    const call = client.produce(metadataOf(request.metadata));
    call.on("data", (result) => results.push(result));
    call.on("error", (error) => resolve({ results, status: errorStatus(error) }));
    call.on("status", (status) => {
      if (status.code === grpc.status.OK) {
        resolve({ results, status: statusOf(status) });
      }
    });
    writeAll(call, request.sends ?? []);
  });
}

async function sendEach(client, request) {
  const results = [];
  let status = { code: grpc.status.OK, details: "" };
  for (const spec of request.sends ?? []) {
    status = await new Promise((resolve) => {
      client.send(sendOf(spec), metadataOf(request.metadata), (error, result) => {
        if (error) {
          resolve(errorStatus(error));
          return;
        }
        results.push(result);
        resolve({ code: grpc.status.OK, details: "" });
      });
    });
    if (status.code !== grpc.status.OK) break;
  }
  return { results, status };
}

function ackFor(kind, messages) {
  const ids = messages.map((message) => message.message_id);
  switch (kind) {
    case "individual":
      return { type: "INDIVIDUAL", message_ids: ids };
    case "cumulative":
      return { type: "CUMULATIVE", message_ids: ids.slice(-1) };
    case "negative":
      return { type: "INDIVIDUAL", negative_message_ids: ids, redelivery_delay_ms: "0" };
    case "none":
      return null;
    default:
      throw new Error(`unknown ack kind ${kind}`);
  }
}

function consume(client, request) {
  return new Promise((resolve) => {
    const messages = [];
    const wanted = request.count ?? 1;
    let finished = false;
    let linger = null;
    const call = client.consume(metadataOf(request.metadata));
    const finish = (status) => {
      if (!finished) {
        finished = true;
        clearTimeout(linger);
        resolve({ messages, status });
      }
    };
    call.on("data", (message) => {
      if (messages.length >= wanted) return;
      messages.push(message);
      if (messages.length < wanted) return;
      const ack = ackFor(request.ack ?? "individual", messages);
      if (ack !== null) call.write(ack);
      // The half-close follows the acknowledgement on the same stream, so the node has taken
      // the acknowledgement when it ends the call; a node that keeps the call open after the
      // half-close is cancelled after a grace period.
      call.end();
      linger = setTimeout(() => {
        call.cancel();
        finish({ code: grpc.status.OK, details: "cancelled by the client after its reads" });
      }, request.linger_ms ?? 1000);
    });
    call.on("error", (error) => finish(errorStatus(error)));
    call.on("status", (status) => finish(statusOf(status)));
  });
}

const METHODS = { produce, send: sendEach, consume };

async function main() {
  let request;
  try {
    request = JSON.parse(process.argv[2] ?? "");
  } catch (error) {
    console.error(`the first argument must be a JSON request: ${error}`);
    process.exit(2);
  }
  const method = METHODS[request.method];
  if (method === undefined) {
    console.error(`unknown method ${request.method}; one of ${Object.keys(METHODS)}`);
    process.exit(2);
  }
  const timer = setTimeout(() => {
    console.error(`no result after ${request.timeout_ms ?? 20000} ms`);
    process.exit(3);
  }, request.timeout_ms ?? 20000);
  const Service = loadService();
  const client = new Service(request.target, credentialsOf(request.tls));
  const result = await method(client, request);
  clearTimeout(timer);
  client.close();
  process.stdout.write(JSON.stringify(result) + "\n");
}

main();
