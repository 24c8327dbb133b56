'use strict';
// The page's event stream (gateway/events.go), read in a dedicated worker so that a
// stream that never ends does not hold up the page's own loading (gateway/page.go, rule
// 3). It reads GET /v1/events with the page's token (an EventSource cannot send one),
// parses the server-sent events and posts each to the page: {type: 'snapshot' | 'error',
// data} and the connection's states {type: 'open' | 'lost' | 'unauthorized'}. A lost
// stream is read again after the server's retry (a second), for as long as the page lives.

const maxEventBytes = 16 << 20; // a bound on one event: nothing the server sends is near it
let token = null;
let retryMS = 1000;
let started = false;

self.onmessage = function (m) {
  token = (m.data && typeof m.data.token === 'string') ? m.data.token : null;
  if (!started) {
    started = true;
    run();
  }
};

function wait(ms) { return new Promise(function (resolve) { setTimeout(resolve, ms); }); }

async function run() {
  for (;;) {
    try {
      const headers = token ? { 'Authorization': 'Bearer ' + token } : {};
      const r = await fetch('/v1/events', { headers: headers, cache: 'no-store', credentials: 'omit' });
      if (r.status === 401) {
        self.postMessage({ type: 'unauthorized' });
        return;
      }
      if (!r.ok || !r.body) {
        throw new Error('HTTP ' + r.status);
      }
      self.postMessage({ type: 'open' });
      await read(r.body);
    } catch (e) {
      // lost: told below, then read again
    }
    self.postMessage({ type: 'lost' });
    await wait(retryMS);
  }
}

async function read(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const chunk = await reader.read();
    if (chunk.done) {
      return;
    }
    buf += decoder.decode(chunk.value, { stream: true }).replace(/\r\n?/g, '\n');
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      dispatch(buf.slice(0, end));
      buf = buf.slice(end + 2);
    }
    if (buf.length > maxEventBytes) {
      reader.cancel();
      throw new Error('an event over ' + maxEventBytes + ' bytes');
    }
  }
}

function dispatch(block) {
  let type = 'message';
  const data = [];
  for (const line of block.split('\n')) {
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) {
      value = value.slice(1);
    }
    if (field === 'event') {
      type = value;
    } else if (field === 'data') {
      data.push(value);
    } else if (field === 'retry' && /^[0-9]+$/.test(value)) {
      retryMS = Math.min(60000, Math.max(100, parseInt(value, 10)));
    }
  }
  if (data.length > 0) {
    self.postMessage({ type: type, data: data.join('\n') });
  }
}
