// Requests to the node's admin API (same origin, paths relative to the page), with failures
// sorted into what the page tells the user.
//
// Requests have no deadline: aborting one that waits for the browser's sign-in prompt would
// close the prompt under the user's fingers. The page watches for silence instead.

/** Why a request failed: `kind` is "unreachable", "unauthorized" (401), "forbidden" (403),
 * "missing" (404) or "failed" (any other error answer). */
export class ApiError extends Error {
  constructor(kind, status, message) {
    super(message);
    this.name = "ApiError";
    this.kind = kind;
    this.status = status;
  }
}

const KINDS = { 401: "unauthorized", 403: "forbidden", 404: "missing" };

async function request(path, method) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: { Accept: "application/json" },
      cache: "no-store",
      credentials: "same-origin",
    });
  } catch {
    throw new ApiError("unreachable", 0, "the connection failed");
  }
  if (response.ok) return response;
  let message = `${response.status} ${response.statusText}`.trim();
  try {
    const body = await response.json();
    if (body && typeof body.error === "string") message = body.error;
  } catch {
    // Not a JSON error document (a proxy's page, say): the status line says enough.
  }
  throw new ApiError(KINDS[response.status] ?? "failed", response.status, message);
}

/** GET `path` (e.g. "api/v1/stats") and return its JSON document. */
export async function getJson(path) {
  const response = await request(path, "GET");
  return response.json();
}

/** DELETE `path`; resolves when the node answered with a 2xx status. */
export async function remove(path) {
  await request(path, "DELETE");
}

/** The API path of a client, its id percent-encoded into one segment ("/" travels as %2F).
 * The ids "." and ".." cannot travel at all (URLs drop them as dot segments, however they are
 * encoded): null. */
export function clientPath(clientId) {
  if (clientId === "." || clientId === "..") return null;
  return `api/v1/clients/${encodeURIComponent(clientId)}`;
}
