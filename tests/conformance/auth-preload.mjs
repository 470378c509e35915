// Loaded into the conformance suite's Node process (NODE_OPTIONS=--import): every HTTP request it
// makes, through fetch or undici, carries the daemon's bearer token, as an agent configured with the
// token would send it. The suite itself has no option for credentials.
const token = process.env.ATOMICTOOLS_TEST_BEARER;
const undici = await import(process.env.ATOMICTOOLS_TEST_UNDICI + "/index.js");

function withAuth(headers) {
  if (headers == null) return { authorization: `Bearer ${token}` };
  if (Array.isArray(headers)) return [...headers, "authorization", `Bearer ${token}`];
  if (typeof headers[Symbol.iterator] === "function") return [...Array.from(headers).flat(), "authorization", `Bearer ${token}`];
  return { ...headers, authorization: `Bearer ${token}` };
}

const agent = new undici.Agent().compose((dispatch) => (options, handler) =>
  dispatch({ ...options, headers: withAuth(options.headers) }, handler));
undici.setGlobalDispatcher(agent);
