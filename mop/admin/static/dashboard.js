// The dashboard: polls the admin API and shows traffic, totals, the node and its clients.
// Rates are differences of the node's cumulative counters between two polls.

import { ApiError, clientPath, getJson, remove } from "./api.js";
import { Chart } from "./chart.js";
import * as format from "./format.js";

const STATS_EVERY_MS = 1500;
const RETRY_EVERY_MS = 3000;
const CLIENTS_EVERY_MS = 5000;
const NODE_EVERY_MS = 30000;
const SEARCH_DELAY_MS = 300;
// A stats request unanswered this long makes the node "not answering" until it answers.
const SILENCE_MS = 10000;
const WINDOW_SECONDS = 180;

const $ = (id) => document.getElementById(id);

const rateChart = { windowSeconds: WINDOW_SECONDS, format: format.rate, minimumScale: 1 };
const countChart = { windowSeconds: WINDOW_SECONDS, format: format.count, minimumScale: 5 };
const charts = {
  in: new Chart($("chart-in"), rateChart),
  out: new Chart($("chart-out"), rateChart),
  connections: new Chart($("chart-connections"), countChart),
};

const state = {
  // The previous poll's counters: {uptime, received, sent}.
  previous: null,
  // Seconds to add to the browser's clock to get the node's (times in the API are the node's).
  skew: 0,
  // An authentication refusal stops all polling until the user asks to try again; polls of an
  // earlier generation do not schedule themselves again.
  blocked: false,
  generation: 0,
  timers: new Set(),
  // What went wrong, by source ("stats", "clients", ...); the most serious one is shown.
  problems: new Map(),
  clients: { query: "", offset: 0, limit: 25, total: 0, ids: [], request: 0 },
  // When the pending stats request was sent (performance.now()), or null.
  waitingSince: null,
};

// -- scheduling ------------------------------------------------------------------------------

/** Run `poll(generation)` after `delay` unless polling was stopped or restarted meanwhile. */
function later(generation, poll, delay) {
  if (generation !== state.generation) return;
  const timer = setTimeout(() => {
    state.timers.delete(timer);
    if (generation === state.generation) poll(generation);
  }, delay);
  state.timers.add(timer);
}

function stopAll() {
  state.generation += 1;
  for (const timer of state.timers) clearTimeout(timer);
  state.timers.clear();
}

function start() {
  stopAll();
  state.blocked = false;
  state.problems.clear();
  renderAlert();
  setLive("starting", "Connecting…");
  pollStats(state.generation);
  pollNode(state.generation);
  pollClients(state.generation);
}

// -- problems --------------------------------------------------------------------------------

const SERIOUSNESS = { unauthorized: 4, forbidden: 4, unreachable: 3, failed: 2, missing: 1 };

function explain(error, what) {
  switch (error.kind) {
    case "unauthorized":
      return [
        "Sign-in needed",
        "The admin API asks for a user name and password (HTTP 401). Sign in as a user that " +
          "admin.roles allows when the browser asks; if the prompt was closed, try again.",
      ];
    case "forbidden":
      return [
        "Not allowed",
        `The node refuses the admin API to this user: ${error.message} (HTTP 403). ` +
          "Only users listed in admin.roles may use it; a private window lets you sign in " +
          "as another user.",
      ];
    case "unreachable":
      return [
        "The node does not answer",
        `No answer from ${location.host} (${error.message}). Is mop running? ` +
          "The page keeps trying.",
      ];
    case "missing":
      return [
        "Part of the admin API is missing",
        `This node has no ${what} (HTTP 404): it may run an older mop.`,
      ];
    default:
      return ["The admin API failed", `${what}: ${error.message} (HTTP ${error.status}).`];
  }
}

/** Record a failed request of `source`; authentication refusals stop polling. */
function report(source, error, what) {
  if (!(error instanceof ApiError)) throw error;
  state.problems.set(source, [error, what]);
  if (error.kind === "unauthorized" || error.kind === "forbidden") {
    state.blocked = true;
    stopAll();
    setLive("blocked", error.kind === "unauthorized" ? "Signed out" : "Not allowed");
  } else if (error.kind === "unreachable") {
    setLive("offline", "Offline");
  }
  renderAlert();
}

function resolved(source) {
  if (state.problems.delete(source)) renderAlert();
}

function renderAlert() {
  let worst = null;
  for (const [error, what] of state.problems.values()) {
    if (!worst || SERIOUSNESS[error.kind] > SERIOUSNESS[worst[0].kind]) worst = [error, what];
  }
  const alert = $("alert");
  if (!worst) {
    alert.hidden = true;
    return;
  }
  const [title, text] = explain(...worst);
  alert.dataset.kind = worst[0].kind;
  $("alert-title").textContent = title;
  $("alert-text").textContent = text;
  $("alert-retry").hidden = !state.blocked;
  alert.hidden = false;
}

function setLive(status, text) {
  const live = $("live");
  if (live.dataset.state !== status || $("live-text").textContent !== text) {
    live.dataset.state = status;
    $("live-text").textContent = text;
  }
}

// -- stats -----------------------------------------------------------------------------------

async function pollStats(generation) {
  let stats;
  state.waitingSince = performance.now();
  try {
    stats = await getJson("api/v1/stats");
  } catch (error) {
    state.waitingSince = null;
    report("stats", error, "/api/v1/stats");
    const now = performance.now() / 1000;
    for (const chart of Object.values(charts)) chart.push(now, null);
    state.previous = null;
    later(generation, pollStats, RETRY_EVERY_MS);
    return;
  }
  state.waitingSince = null;
  resolved("stats");
  if (!state.blocked) setLive("live", "Live");
  $("updated").textContent = `updated ${format.clockTime(new Date())}`;
  renderStats(stats);
  later(generation, pollStats, STATS_EVERY_MS);
}

/** A node that takes connections but does not answer is reported while its answer is due. */
function watchSilence() {
  const waiting = state.waitingSince;
  if (waiting === null || state.problems.has("stats")) return;
  if (performance.now() - waiting > SILENCE_MS) {
    const silence = new ApiError("unreachable", 0, `silent for ${SILENCE_MS / 1000} s`);
    report("stats", silence, "/api/v1/stats");
  }
}

function show(id, value, text) {
  const element = $(id);
  element.dataset.value = String(value);
  element.textContent = text;
}

function renderStats(stats) {
  const now = performance.now() / 1000;
  const previous = state.previous;
  let rateIn = null;
  let rateOut = null;
  // A node that restarted has a smaller uptime and smaller counters: start again from here.
  if (previous && stats.uptime > previous.uptime && stats.messages_received >= previous.received) {
    const elapsed = stats.uptime - previous.uptime;
    rateIn = (stats.messages_received - previous.received) / elapsed;
    rateOut = Math.max(0, stats.messages_sent - previous.sent) / elapsed;
  }
  state.previous = {
    uptime: stats.uptime,
    received: stats.messages_received,
    sent: stats.messages_sent,
  };

  charts.in.push(now, rateIn);
  charts.out.push(now, rateOut);
  charts.connections.push(now, stats.connections);
  show("rate-in", rateIn ?? "", format.rate(rateIn ?? NaN));
  show("rate-out", rateOut ?? "", format.rate(rateOut ?? NaN));
  show("connections", stats.connections, format.count(stats.connections));
  describeChart("chart-in", "Messages received per second", charts.in, rateIn, format.rate);
  describeChart("chart-out", "Messages sent per second", charts.out, rateOut, format.rate);
  describeChart(
    "chart-connections",
    "Open connections",
    charts.connections,
    stats.connections,
    format.count,
  );
  const minutes = WINDOW_SECONDS / 60;
  for (const [id, chart] of [["chart-in-note", charts.in], ["chart-out-note", charts.out]]) {
    $(id).textContent = `peak ${format.rate(chart.peak())}/s in the last ${minutes} min`;
  }
  $("connections-note").textContent = Object.entries(stats.connections_by_protocol ?? {})
    .map(([protocol, count]) => `${protocolName(protocol)} ${format.count(count)}`)
    .join(" · ");

  show("sessions", stats.sessions, format.count(stats.sessions));
  show("subscriptions", stats.subscriptions, format.count(stats.subscriptions));
  $("subscriptions-note").textContent = `${format.count(stats.shared_subscriptions)} shared`;
  show("retained", stats.retained, format.count(stats.retained));
  show("dropped", stats.messages_dropped, format.count(stats.messages_dropped));
  show("bytes-in", stats.bytes_received, format.bytes(stats.bytes_received));
  show("bytes-out", stats.bytes_sent, format.bytes(stats.bytes_sent));
  $("messages-in-total").textContent = `${format.count(stats.messages_received)} messages`;
  $("messages-out-total").textContent = `${format.count(stats.messages_sent)} messages`;
  show("memory", stats.memory_rss, format.bytes(stats.memory_rss));
  $("node-uptime").textContent = format.duration(stats.uptime);
}

function describeChart(id, what, chart, value, formatter) {
  const now = value === null ? "not known yet" : formatter(value);
  const minutes = WINDOW_SECONDS / 60;
  $(id).setAttribute(
    "aria-label",
    `${what} over the last ${minutes} minutes: now ${now}, peak ${formatter(chart.peak())}`,
  );
}

function protocolName(protocol) {
  return { mqtt: "MQTT", pulsar: "Pulsar" }[protocol] ?? protocol;
}

// -- node ------------------------------------------------------------------------------------

async function pollNode(generation) {
  try {
    renderNode(await getJson("api/v1/node"));
    resolved("node");
  } catch (error) {
    report("node", error, "/api/v1/node");
  }
  later(generation, pollNode, NODE_EVERY_MS);
}

function renderNode(node) {
  // started_at + uptime is the node's clock when it answered.
  state.skew = node.started_at + node.uptime - Date.now() / 1000;
  $("node-version").textContent = node.version;
  $("node-mode").textContent = node.mode;
  if ($("node-uptime").textContent === "—") {
    $("node-uptime").textContent = format.duration(node.uptime);
  }
  $("node-namespace").textContent = `${node.tenant}/${node.namespace}`;
  $("node-protocols").textContent = node.protocols.map(protocolName).join(", ");
  const list = $("listeners");
  list.replaceChildren(
    ...node.listeners.map((listener) => {
      const item = document.createElement("li");
      const name = document.createElement("span");
      name.className = "listener-name";
      name.textContent = `${protocolName(listener.protocol)} ${listener.kind}`;
      const address = document.createElement("code");
      const host = listener.host.includes(":") ? `[${listener.host}]` : listener.host;
      address.textContent = `${host}:${listener.port}`;
      item.append(name, address);
      return item;
    }),
  );
  if (!node.listeners.length) list.textContent = "No listeners yet.";
}

// -- clients ---------------------------------------------------------------------------------

function clientsPath() {
  const { query, offset, limit } = state.clients;
  const params = new URLSearchParams({ offset: String(offset), limit: String(limit) });
  if (query) params.set("q", query);
  return `api/v1/clients?${params}`;
}

async function loadClients() {
  const request = ++state.clients.request;
  $("clients-table").setAttribute("aria-busy", "true");
  try {
    const page = await getJson(clientsPath());
    if (request !== state.clients.request) return; // a newer search has been sent
    // Past the end (the last clients of the last page left): show the last page instead.
    const limit = state.clients.limit;
    const lastPage = Math.floor(Math.max(0, page.total - 1) / limit) * limit;
    if (!page.items.length && lastPage < state.clients.offset) {
      state.clients.offset = lastPage;
      await loadClients();
      return;
    }
    renderClients(page);
    resolved("clients");
  } catch (error) {
    if (request !== state.clients.request) return;
    report("clients", error, "/api/v1/clients");
    if (!state.clients.ids.length) showEmpty("The clients could not be loaded.");
  } finally {
    if (request === state.clients.request) $("clients-table").removeAttribute("aria-busy");
  }
}

async function pollClients(generation) {
  const table = $("clients-table");
  // Rows do not move under a user about to press one of their buttons (pointer over the table,
  // or keyboard focus in it).
  const busy = table.matches(":hover") || table.querySelector(":focus-visible") !== null;
  if (!document.hidden && !busy) await loadClients();
  later(generation, pollClients, CLIENTS_EVERY_MS);
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function renderClients(page) {
  const body = $("clients-body");
  const clients = state.clients;
  clients.total = page.total;
  clients.ids = page.items.map((client) => client.client_id);
  const nowMillis = Date.now() + state.skew * 1000;
  const rows = page.items.map((client) => {
    const row = document.createElement("tr");
    row.dataset.clientId = client.client_id;
    const version = client.protocol === "mqtt" ? ` ${client.protocol_version}` : "";
    const connected = cell(format.ago(client.connected_at, nowMillis));
    connected.title = format.dateTime(client.connected_at);
    const queued = cell(format.count(client.queued), "num");
    queued.title = `${format.count(client.inflight)} in flight`;
    const id = cell(client.client_id || "(empty)", "mono client-id");
    id.title = client.client_id;
    row.append(
      id,
      cell(`${protocolName(client.protocol)}${version}`),
      cell(client.username ?? "—", client.username ? "" : "muted"),
      cell(client.peer, "mono"),
      connected,
      cell(format.count(client.subscriptions), "num"),
      cell(format.count(client.messages_in), "num"),
      cell(format.count(client.messages_out), "num"),
      queued,
      actionCell(client.client_id),
    );
    return row;
  });
  if (rows.length) {
    body.replaceChildren(...rows);
  } else {
    const query = clients.query;
    showEmpty(query ? `No connected client matches “${query}”.` : "No clients are connected.");
  }

  const first = page.total ? clients.offset + 1 : 0;
  const last = clients.offset + page.items.length;
  $("pager-text").textContent = page.total
    ? `${format.count(first)}–${format.count(last)} of ${format.count(page.total)}`
    : "0 clients";
  $("prev-page").disabled = clients.offset === 0;
  $("next-page").disabled = last >= page.total;
}

function showEmpty(message) {
  const row = document.createElement("tr");
  const empty = cell(message, "empty");
  empty.colSpan = 10;
  row.append(empty);
  $("clients-body").replaceChildren(row);
}

function actionCell(clientId) {
  const td = document.createElement("td");
  td.className = "action";
  const button = document.createElement("button");
  button.type = "button";
  button.className = "button danger small";
  button.textContent = "Disconnect";
  button.setAttribute("aria-label", `Disconnect ${clientId || "the client with the empty id"}`);
  if (clientPath(clientId) === null) {
    button.disabled = true;
    button.title = "This client id cannot be written in a URL path.";
  } else {
    button.addEventListener("click", () => kick(clientId, button));
  }
  td.append(button);
  return td;
}

async function kick(clientId, button) {
  const question =
    `Disconnect the client “${clientId}”?\n\n` +
    "Its session is kept as its expiry says, and it may connect again.";
  if (!window.confirm(question)) return;
  button.disabled = true;
  button.textContent = "Disconnecting…";
  try {
    await remove(clientPath(clientId));
    $("clients-notice").textContent = `Disconnected “${clientId}”.`;
  } catch (error) {
    if (error instanceof ApiError && error.kind === "missing") {
      $("clients-notice").textContent = `“${clientId}” was no longer connected.`;
    } else {
      report("kick", error, `Disconnecting “${clientId}”`);
      button.disabled = false;
      button.textContent = "Disconnect";
      return;
    }
  }
  resolved("kick");
  $("search").focus(); // the row goes away; keep the focus somewhere useful
  await loadClients();
  // The node may list the client for a moment longer while its connection closes.
  if (state.clients.ids.includes(clientId)) setTimeout(loadClients, 1000);
}

// -- controls --------------------------------------------------------------------------------

let searchTimer = null;

function search(immediately) {
  clearTimeout(searchTimer);
  const run = () => {
    state.clients.query = $("search").value.trim();
    state.clients.offset = 0;
    $("clients-notice").textContent = "";
    loadClients();
  };
  if (immediately) run();
  else searchTimer = setTimeout(run, SEARCH_DELAY_MS);
}

$("search").addEventListener("input", () => search(false));
$("search-form").addEventListener("submit", (event) => {
  event.preventDefault();
  search(true);
});
$("refresh").addEventListener("click", () => loadClients());
$("page-size").addEventListener("change", (event) => {
  state.clients.limit = Number(event.target.value);
  state.clients.offset = 0;
  loadClients();
});
$("prev-page").addEventListener("click", () => {
  state.clients.offset = Math.max(0, state.clients.offset - state.clients.limit);
  loadClients();
});
$("next-page").addEventListener("click", () => {
  state.clients.offset += state.clients.limit;
  loadClients();
});
$("alert-retry").addEventListener("click", start);

setInterval(watchSilence, 1000);
start();
