'use strict';
// The ortbus page (gateway/page.go). Everything it shows comes from the HTTP API with the
// caller's token: GET /v1/snapshot once, then the event stream GET /v1/events (read by the
// worker stream.js), one snapshot a second. Everything it does is a call of the same API
// (POST /v1/pause, /v1/job/pause, /v1/job/resume, /v1/job/cancel, /v1/job/results), which
// applies its owner rules. Every value from the API is shown as text (textContent), never
// parsed as HTML.
(function () {
  const tokenKey = 'ortbus.token';
  const pauseForMS = 10 * 60 * 1000; // "pause" holds a class for 10 minutes unless resumed
  const backgroundPriority = 2; // an account may pause only classes of this priority and up
  const maxFailedShown = 50;
  const maxResultPages = 20;

  let token = null;
  let worker = null;
  const failedItems = {}; // job id -> {open, loading, items, error}

  const $ = function (id) { return document.getElementById(id); };

  // el makes an element: attrs are properties (className, title, ...) or data-* and aria-*
  // attributes; children are nodes or strings (as text).
  function el(tag, attrs) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k.startsWith('data-') || k.startsWith('aria-')) {
        e.setAttribute(k, attrs[k]);
      } else {
        e[k] = attrs[k];
      }
    }
    for (let i = 2; i < arguments.length; i++) {
      const c = arguments[i];
      if (c !== null && c !== undefined) {
        e.append(c instanceof Node ? c : String(c));
      }
    }
    return e;
  }

  function setText(e, s) {
    s = String(s);
    if (e.textContent !== s) {
      e.textContent = s;
    }
  }

  // keyed returns container's child keyed key, made by make() the first time; the children
  // not named in this round are removed by prune.
  function keyed(container, key, make) {
    for (const c of container.children) {
      if (c.dataset.key === key) {
        c.dataset.seen = '1';
        return c;
      }
    }
    const c = make();
    c.dataset.key = key;
    c.dataset.seen = '1';
    container.append(c);
    return c;
  }

  function prune(container) {
    for (const c of Array.from(container.children)) {
      if (c.dataset.seen !== '1') {
        c.remove();
      }
      delete c.dataset.seen;
    }
  }

  function mib(b) {
    const v = (b || 0) / 1048576;
    return (v < 100 ? v.toFixed(1) : Math.round(v).toString()) + ' MiB';
  }

  function ms(v) {
    if (v === undefined || v === null) {
      return '–';
    }
    return v < 10 ? v.toFixed(2) + ' ms' : v < 1000 ? v.toFixed(0) + ' ms' : (v / 1000).toFixed(2) + ' s';
  }

  function duration(s) {
    if (!isFinite(s) || s < 0) {
      return '–';
    }
    s = Math.round(s);
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const sec = s % 60;
    return h > 0 ? h + 'h ' + m + 'm' : m > 0 ? m + 'm ' + sec + 's' : sec + 's';
  }

  function ownerName(owner) {
    if (!owner) {
      return 'operator';
    }
    return owner.startsWith('account:') ? owner.slice('account:'.length) : owner;
  }

  function perClass(m) {
    const parts = [];
    for (const k of Object.keys(m || {}).sort()) {
      if (m[k]) {
        parts.push(k + ' ' + m[k]);
      }
    }
    return parts.length ? parts.join(', ') : '0';
  }

  // ---- the API ----

  async function api(method, path, body) {
    const headers = { 'Accept': 'application/json' };
    if (token) {
      headers['Authorization'] = 'Bearer ' + token;
    }
    const init = { method: method, headers: headers, cache: 'no-store', credentials: 'omit' };
    if (method === 'POST') {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body || {});
    }
    const r = await fetch(path, init);
    let data = null;
    try {
      data = await r.json();
    } catch (e) {
      data = null;
    }
    if (!r.ok) {
      const err = new Error((data && data.message) || ('HTTP ' + r.status));
      err.status = r.status;
      err.code = data && data.code;
      throw err;
    }
    return data;
  }

  function showError(msg) {
    const p = $('error');
    p.hidden = !msg;
    setText(p, msg || '');
  }

  async function act(what, method, path, body) {
    try {
      await api(method, path, body);
      showError('');
      await refresh();
    } catch (e) {
      if (e.status === 401) {
        askToken();
        return;
      }
      showError(what + ': ' + (e.code ? e.code + ': ' : '') + e.message);
    }
  }

  async function refresh() {
    render(await api('GET', '/v1/snapshot'));
  }

  // ---- the token and the stream ----

  function takeToken() {
    const m = /^#token=(.+)$/.exec(location.hash);
    if (m) {
      try {
        sessionStorage.setItem(tokenKey, decodeURIComponent(m[1]));
      } catch (e) {
        // no storage: the token lives as long as the page
        token = decodeURIComponent(m[1]);
      }
      history.replaceState(null, '', location.pathname + location.search);
    }
    try {
      token = sessionStorage.getItem(tokenKey) || token;
    } catch (e) {
      // keep what the address gave
    }
    $('forget').hidden = !token;
  }

  function askToken() {
    stopStream();
    setConn('lost', 'needs a token');
    $('login').hidden = false;
    $('token').focus();
  }

  function setConn(cls, text) {
    const c = $('conn');
    c.className = 'conn ' + cls;
    setText(c, text);
  }

  function stopStream() {
    if (worker) {
      worker.terminate();
      worker = null;
    }
  }

  function startStream() {
    stopStream();
    worker = new Worker('/page/stream.js');
    worker.onmessage = function (m) {
      const msg = m.data || {};
      if (msg.type === 'snapshot') {
        try {
          render(JSON.parse(msg.data));
        } catch (e) {
          showError('a snapshot the page cannot read: ' + e.message);
        }
      } else if (msg.type === 'error') {
        showError('the gateway could not make a snapshot: ' + msg.data);
      } else if (msg.type === 'open') {
        setConn('live', 'live');
      } else if (msg.type === 'lost') {
        setConn('lost', 'reconnecting');
      } else if (msg.type === 'unauthorized') {
        askToken();
      }
    };
    worker.postMessage({ token: token });
  }

  async function start() {
    $('login').hidden = true;
    try {
      await refresh();
      showError('');
    } catch (e) {
      if (e.status === 401) {
        askToken();
        return;
      }
      showError('the gateway did not answer: ' + e.message);
      setConn('lost', 'reconnecting');
    }
    startStream();
  }

  // ---- rendering ----

  function render(s) {
    if (!s || !s.status) {
      return;
    }
    const st = s.status;
    setText($('gateway'), 'gateway ' + st.gateway);
    setText($('who'), 'as ' + ownerName(s.account));
    renderDevices(st);
    renderPools(st);
    renderClasses(st, s);
    renderLeases(st, s.now_unix_ms);
    renderPauses(st, s);
    renderJobs(s);
  }

  function workerBytes(w) {
    // The memory measured of the process: its own on its device where the device has a
    // reader, else (the CPU) its resident set.
    return w.device_source ? (w.device_bytes || 0) : (w.rss_bytes || 0);
  }

  // deviceSegments are the device's bar, left to right: each live worker's measured
  // memory, each lease, others' leases (an account's view), foreign processes, free.
  function deviceSegments(d, st) {
    const segs = [];
    const pools = new Set(d.pools || []);
    for (const w of st.workers || []) {
      if (pools.has(w.pool) && w.state !== 'dead' && w.state !== 'asleep') {
        segs.push({ kind: 'worker', bytes: workerBytes(w), label: 'worker ' + w.worker + ' (' + w.pool + ')' });
      }
    }
    let shown = 0;
    for (const l of d.leases || []) {
      shown += l.bytes;
      const what = 'lease ' + (l.holder || '(no holder)') + ' · ' + l.class + (l.reclaim ? ' · reclaimable' : '');
      segs.push({ kind: l.reclaim ? 'lease reclaim' : 'lease', bytes: l.bytes, label: what, holder: l.holder || '' });
    }
    if ((d.leased_bytes || 0) > shown) {
      segs.push({ kind: 'other', bytes: d.leased_bytes - shown, label: "others' leases" });
    }
    if (d.foreign_bytes) {
      segs.push({ kind: 'foreign', bytes: d.foreign_bytes, label: 'foreign processes' });
    }
    segs.push({ kind: 'free', bytes: d.free_bytes || 0, label: 'free' });
    return segs;
  }

  function renderDevices(st) {
    const list = $('device-list');
    for (const d of st.devices || []) {
      const card = keyed(list, d.device, function () {
        const c = el('div', { className: 'card device' });
        c.refs = { head: el('h3'), info: el('div', { className: 'muted' }), bar: el('div', { className: 'bar' }), legend: el('ul', { className: 'legend' }) };
        c.append(c.refs.head, c.refs.info, c.refs.bar, c.refs.legend);
        return c;
      });
      card.dataset.device = d.device;
      const segs = deviceSegments(d, st);
      let scale = d.capacity_bytes || 0;
      if (!scale) {
        scale = Math.max(1, d.budget_bytes || 0, segs.reduce(function (a, s) { return a + s.bytes; }, 0));
      }
      setText(card.refs.head, d.device);
      let info = 'capacity ' + mib(d.capacity_bytes) + ' · budget ' + mib(d.budget_bytes) + ' (' + Math.round((d.safe_fraction || 0) * 100) + ' %)' +
        ' · models admitted ' + mib(d.admitted_bytes) + ' · leased ' + mib(d.leased_bytes) + ' · free ' + mib(d.free_bytes);
      if (d.reserved_bytes) {
        info += ' · reserved ' + mib(d.reserved_bytes);
      }
      info += d.driver_used_bytes ? ' · the driver reads ' + mib(d.driver_used_bytes) + ' in use' : ' · no driver reading';
      setText(card.refs.info, info);
      const bar = [];
      const legend = [];
      let left = 0;
      let used = 0;
      for (const s of segs) {
        // Free is the room left under the budget line: drawn up to it at most (workers'
        // measured memory may pass the peaks the budget counts).
        const drawn = s.kind === 'free' && d.budget_bytes ? Math.min(s.bytes, Math.max(0, d.budget_bytes - used)) : s.bytes;
        used += s.bytes;
        const width = Math.min(100 - left, (drawn / scale) * 100);
        const seg = el('div', { className: 'seg ' + s.kind, title: s.label + ': ' + mib(s.bytes), 'data-kind': s.kind.split(' ')[0], 'data-bytes': String(s.bytes) });
        seg.style.left = left + '%';
        seg.style.width = Math.max(0, width) + '%';
        bar.push(seg);
        left += Math.max(0, width);
        legend.push(el('li', { 'data-kind': s.kind.split(' ')[0] }, el('span', { className: 'sw ' + s.kind }), s.label + ' ' + mib(s.bytes)));
      }
      if (d.budget_bytes) {
        const line = el('div', { className: 'line budget', title: 'budget ' + mib(d.budget_bytes) });
        line.style.left = Math.min(100, (d.budget_bytes / scale) * 100) + '%';
        bar.push(line);
        legend.push(el('li', {}, el('span', { className: 'sw budget' }), 'budget line ' + mib(d.budget_bytes)));
      }
      if (d.driver_used_bytes) {
        const line = el('div', { className: 'line driver', title: 'the driver reads ' + mib(d.driver_used_bytes) });
        line.style.left = Math.min(100, (d.driver_used_bytes / scale) * 100) + '%';
        bar.push(line);
        legend.push(el('li', {}, el('span', { className: 'sw driver' }), "the driver's reading " + mib(d.driver_used_bytes)));
      }
      card.refs.bar.replaceChildren.apply(card.refs.bar, bar);
      card.refs.legend.replaceChildren.apply(card.refs.legend, legend);
    }
    prune(list);
  }

  const workerCols = ['worker', 'state', 'runtime', 'ep', 'device', 'queued', 'running', 'served', 'failed', 'restarts', 'last exit', 'memory', 'heartbeat'];

  function renderPools(st) {
    const list = $('pool-list');
    for (const p of st.pools || []) {
      const card = keyed(list, p.name, function () {
        const c = el('div', { className: 'card pool' });
        const head = el('tr');
        for (const h of workerCols) {
          head.append(el('th', {}, h));
        }
        c.refs = { head: el('h3'), info: el('div', { className: 'muted' }), rows: el('tbody'), models: el('div') };
        c.append(c.refs.head, c.refs.info, el('table', {}, el('thead', {}, head), c.refs.rows), c.refs.models);
        return c;
      });
      card.dataset.pool = p.name;
      setText(card.refs.head, 'pool ' + p.name);
      let info = 'ep ' + p.ep + ' · device ' + p.device + ' · ' + p.live + ' of ' + p.workers + ' workers live · classes ' + (p.classes || []).join(', ') + (p.local ? '' : ' · remote');
      if (p.crash_looping) {
        info += ' · CRASH-LOOPING';
      }
      if (p.error) {
        info += ' · error ' + p.error.code + ': ' + p.error.message;
      }
      if (p.loading && p.loading.length) {
        info += ' · loading ' + p.loading.join(', ');
      }
      for (const m of Object.keys(p.skipped || {}).sort()) {
        info += ' · skipped ' + m + ': ' + p.skipped[m];
      }
      if (p.unloaded && p.unloaded.length) {
        info += ' · unloaded ' + p.unloaded.join(', ');
      }
      setText(card.refs.info, info);
      const models = [];
      for (const w of st.workers || []) {
        if (w.pool !== p.name) {
          continue;
        }
        const row = keyed(card.refs.rows, w.worker, function () {
          const r = el('tr', { className: 'worker' });
          r.cells2 = workerCols.map(function () { return el('td'); });
          r.append.apply(r, r.cells2);
          return r;
        });
        const mem = w.device_source ? mib(w.device_bytes) + ' on ' + (w.device || p.device) + ' (' + w.device_source + '), RSS ' + mib(w.rss_bytes) : 'RSS ' + mib(w.rss_bytes);
        const vals = [w.worker, w.state, w.runtime, w.ep, w.device || p.device, perClass(w.queued), perClass(w.running),
          w.served, w.failed, w.restarts, w.last_exit || (w.error ? w.error.code + ': ' + w.error.message : ''), mem, (w.heartbeat_age_ms / 1000).toFixed(1) + ' s ago'];
        vals.forEach(function (v, i) { setText(row.cells2[i], v); });
        row.cells2[1].className = 'state-' + w.state;
        row.cells2[2].title = w.library || '';
        for (const m of w.models || []) {
          let line = m.name + ' (' + m.kind + ') on ' + w.worker + ': ' + (m.state || (m.loaded ? 'ready' : 'not loaded')) + ' · peak ' + mib(m.peak_bytes) + (m.peak_source ? ' (' + m.peak_source + ')' : '');
          if (m.error) {
            line += ' · ' + m.error.code + ': ' + m.error.message;
          }
          if (m.warmup_error) {
            line += ' · warm-up: ' + m.warmup_error;
          }
          models.push(el('li', { className: 'state-' + (m.state || '') }, line));
        }
      }
      prune(card.refs.rows);
      card.refs.models.replaceChildren(el('ul', { className: 'models' }, ...models));
    }
    prune(list);
  }

  // spark draws points (null: no value) as an SVG polyline, scaled to their maximum.
  function spark(points, stepMS) {
    const ns = 'http://www.w3.org/2000/svg';
    const svg = document.createElementNS(ns, 'svg');
    svg.setAttribute('class', 'spark');
    svg.setAttribute('viewBox', '0 0 160 28');
    svg.setAttribute('preserveAspectRatio', 'none');
    const vals = (points || []).filter(function (v) { return v !== null; });
    if (!vals.length) {
      return svg;
    }
    const top = Math.max.apply(null, vals) || 1;
    const n = Math.max(points.length - 1, 1);
    let seg = [];
    const flush = function () {
      if (seg.length) {
        const pl = document.createElementNS(ns, 'polyline');
        pl.setAttribute('points', seg.length === 1 ? seg[0] + ' ' + seg[0] : seg.join(' '));
        svg.append(pl);
      }
      seg = [];
    };
    points.forEach(function (v, i) {
      if (v === null) {
        flush();
        return;
      }
      seg.push((i / n * 158 + 1).toFixed(1) + ',' + (27 - (v / top) * 25).toFixed(1));
    });
    flush();
    const title = document.createElementNS(ns, 'title');
    title.textContent = 'p95 over the last minute, every ' + duration(stepMS / 1000) + '; highest ' + ms(top);
    svg.append(title);
    return svg;
  }

  const classCols = ['name', 'priority', 'chain', 'queued', 'running', 'answered', 'p50', 'p95', 'shed', 'expired', 'chart', 'actions'];

  function renderClasses(st, s) {
    const body = $('class-table').tBodies[0];
    for (const c of st.classes || []) {
      const row = keyed(body, c.name, function () {
        const r = el('tr');
        r.cells2 = classCols.map(function () { return el('td'); });
        r.append.apply(r, r.cells2);
        const pause = el('button', { type: 'button', id: 'pause-' + c.name, className: 'pause-class' }, 'pause');
        const resume = el('button', { type: 'button', id: 'resume-' + c.name, className: 'resume-class' }, 'resume');
        pause.title = 'pause ' + c.name + ' for 10 minutes (its queued work waits; what runs finishes)';
        pause.onclick = function () { act('pause ' + c.name, 'POST', '/v1/pause', { action: 'pause', class: c.name, for_ms: pauseForMS }); };
        resume.onclick = function () { act('resume ' + c.name, 'POST', '/v1/pause', { action: 'resume', class: c.name }); };
        r.cells2[11].append(pause, ' ', resume);
        return r;
      });
      const vals = [c.name, c.priority, (c.chain || []).join(' → '), c.queued + ' / ' + c.bound, c.running, c.answered_1m || 0,
        ms(c.p50_ms_1m), ms(c.p95_ms_1m), c.shed || 0, c.expired || 0];
      vals.forEach(function (v, i) { setText(row.cells2[i], v); });
      const points = (s.p95_history || {})[c.name] || [];
      const key = JSON.stringify(points);
      if (row.sparkKey !== key) {
        row.sparkKey = key;
        row.cells2[10].replaceChildren(spark(points, s.p95_history_step_ms));
      }
      // An account pauses only background classes (the API refuses the others).
      for (const b of row.cells2[11].querySelectorAll('button')) {
        b.hidden = !!s.account && c.priority < backgroundPriority;
      }
    }
    prune(body);
  }

  function renderLeases(st, now) {
    const gates = {};
    for (const g of st.gates || []) {
      gates[g.device] = g;
    }
    const body = $('lease-table').tBodies[0];
    const rows = [];
    for (const d of st.devices || []) {
      for (const l of d.leases || []) {
        const g = gates[l.device];
        const kind = [l.gate ? 'gated' : '', l.reclaim ? 'reclaimable' : '', l.pressed ? 'pressed' : ''].filter(Boolean).join(', ') || 'plain';
        const paused = l.gate ? (g && g.paused ? 'yes' : 'no') : '–';
        rows.push(el('tr', { className: 'lease', 'data-holder': l.holder || '', 'data-device': l.device },
          el('td', {}, l.device), el('td', {}, l.holder || ''), el('td', {}, l.class), el('td', { className: 'num' }, mib(l.bytes)),
          el('td', {}, kind), el('td', {}, paused), el('td', {}, duration((l.expires_unix_ms - now) / 1000))));
      }
    }
    body.replaceChildren.apply(body, rows);
    $('no-leases').hidden = rows.length > 0;
    $('lease-table').hidden = rows.length === 0;
    const gbody = $('gate-table').tBodies[0];
    const grows = [];
    for (const g of st.gates || []) {
      grows.push(el('tr', {}, el('td', {}, g.device), el('td', {}, g.class), el('td', { className: g.paused ? 'state-paused' : '' }, g.paused ? 'paused' : 'open'),
        el('td', {}, Math.round((g.paused_share_1m || 0) * 100) + ' %'), el('td', {}, duration((g.paused_total_ms || 0) / 1000)), el('td', {}, g.tenants)));
    }
    gbody.replaceChildren.apply(gbody, grows);
    $('gate-table').hidden = grows.length === 0;
  }

  function renderPauses(st, s) {
    const body = $('pause-table').tBodies[0];
    const pauses = st.pauses || [];
    for (const p of pauses) {
      const key = p.class + '|' + (p.device || '') + '|' + (p.owner || '');
      const row = keyed(body, key, function () {
        const r = el('tr', { className: 'pause', 'data-class': p.class, 'data-owner': ownerName(p.owner) });
        r.cells2 = [el('td'), el('td'), el('td'), el('td'), el('td')];
        r.append.apply(r, r.cells2);
        if ((p.owner || '') === (s.account || '')) {
          const b = el('button', { type: 'button', className: 'resume-pause' }, 'resume');
          b.onclick = function () { act('resume ' + p.class, 'POST', '/v1/pause', { action: 'resume', class: p.class, device: p.device || '' }); };
          r.cells2[4].append(b);
        }
        return r;
      });
      setText(row.cells2[0], p.class);
      setText(row.cells2[1], p.device || 'every device');
      setText(row.cells2[2], ownerName(p.owner));
      setText(row.cells2[3], duration((p.until_unix_ms - s.now_unix_ms) / 1000));
    }
    prune(body);
    $('no-pauses').hidden = pauses.length > 0;
    $('pause-table').hidden = pauses.length === 0;
  }

  function renderJobs(s) {
    const list = $('job-list');
    const jobs = (s.jobs && s.jobs.jobs) || [];
    let note = '';
    if (s.jobs_error) {
      note = 'no jobs: ' + s.jobs_error.code + ': ' + s.jobs_error.message;
    } else if (!jobs.length) {
      note = 'no jobs';
    }
    setText($('jobs-note'), note);
    for (const j of jobs) {
      const card = keyed(list, j.job, function () { return jobCard(j.job); });
      updateJob(card, j);
    }
    prune(list);
  }

  function jobCard(id) {
    const c = el('div', { className: 'card job', 'data-job': id });
    const r = {
      id: el('strong', {}, id), state: el('span'), what: el('span', { className: 'muted' }),
      bar: el('div', { className: 'progress', role: 'progressbar', 'aria-valuemin': '0', 'aria-valuemax': '100' }),
      figures: el('span', { className: 'figures' }), extra: el('div', { className: 'muted' }),
      pause: el('button', { type: 'button', className: 'job-pause' }, 'pause'),
      resume: el('button', { type: 'button', className: 'job-resume' }, 'resume'),
      cancel: el('button', { type: 'button', className: 'job-cancel' }, 'cancel'),
      showFailed: el('button', { type: 'button', className: 'job-failed' }, 'failed items'),
      failed: el('ul', { className: 'failed-items' }),
    };
    r.done = el('div', { className: 'done' });
    r.failedPart = el('div', { className: 'failed' });
    r.bar.append(r.done, r.failedPart);
    r.pause.onclick = function () { act('pause job ' + id, 'POST', '/v1/job/pause', { job: id }); };
    r.resume.onclick = function () { act('resume job ' + id, 'POST', '/v1/job/resume', { job: id }); };
    r.cancel.onclick = function () {
      if (confirm('Cancel job ' + id + '? Its items not yet run will not run.')) {
        act('cancel job ' + id, 'POST', '/v1/job/cancel', { job: id });
      }
    };
    r.showFailed.onclick = function () { toggleFailed(id, c); };
    c.refs = r;
    c.append(el('div', { className: 'head' }, r.id, r.state, r.what, el('span', { className: 'actions' }, r.pause, r.resume, r.cancel, r.showFailed)),
      el('div', {}, r.bar, r.figures), r.extra, r.failed);
    return c;
  }

  function updateJob(c, j) {
    const r = c.refs;
    const settled = j.done + j.failed;
    const pct = j.total ? (settled / j.total) * 100 : 100;
    c.dataset.state = j.state;
    setText(r.state, j.state);
    r.state.className = 'state-' + j.state;
    setText(r.what, j.op + (j.model ? ' ' + j.model : '') + ' · class ' + j.class + (j.pool ? ' · pool ' + j.pool : ''));
    r.done.style.width = (j.total ? (j.done / j.total) * 100 : 0) + '%';
    r.failedPart.style.left = r.done.style.width;
    r.failedPart.style.width = (j.total ? (j.failed / j.total) * 100 : 0) + '%';
    r.bar.setAttribute('aria-valuenow', String(Math.round(pct)));
    r.bar.dataset.settled = String(settled);
    r.bar.dataset.total = String(j.total);
    let fig = settled + ' / ' + j.total + ' (' + Math.floor(pct) + ' %) · ' + j.done + ' done · ' + j.failed + ' failed';
    if (j.running) {
      fig += ' · ' + j.running + ' running';
    }
    if (j.state === 'running') {
      fig += ' · ' + (j.rate_per_s || 0).toFixed(1) + ' items/s · ETA ' + (j.eta_s > 0 ? duration(j.eta_s) : '–');
    }
    setText(r.figures, fig);
    let extra = [];
    if (j.cached) {
      extra.push(j.cached + ' from the cache, ' + j.computed + ' computed');
    }
    if (j.waiting) {
      extra.push('waiting: ' + j.waiting.code + ': ' + j.waiting.message);
    }
    if (j.error) {
      extra.push('failed: ' + j.error.code + ': ' + j.error.message);
    }
    if (j.skipped_total) {
      extra.push(j.skipped_total + ' files skipped');
    }
    setText(r.extra, extra.join(' · '));
    r.pause.hidden = j.state !== 'running';
    r.resume.hidden = j.state !== 'paused';
    r.cancel.hidden = j.state !== 'running' && j.state !== 'paused';
    r.showFailed.hidden = !j.failed;
    renderFailed(j.job, c);
  }

  async function toggleFailed(id, card) {
    const f = failedItems[id] || (failedItems[id] = { open: false, items: [] });
    f.open = !f.open;
    if (f.open) {
      f.loading = true;
      f.error = '';
      f.items = [];
      renderFailed(id, card);
      try {
        let from = 0;
        for (let page = 0; page < maxResultPages && f.items.length < maxFailedShown; page++) {
          const res = await api('POST', '/v1/job/results', { job: id, from: from });
          for (const it of res.results || []) {
            if (it.error && f.items.length < maxFailedShown) {
              f.items.push(it.path + ': ' + it.error.code + ': ' + it.error.message);
            }
          }
          if (!res.more || res.next === from) {
            break;
          }
          from = res.next;
        }
      } catch (e) {
        f.error = e.message;
      }
      f.loading = false;
    }
    renderFailed(id, card);
  }

  function renderFailed(id, card) {
    const f = failedItems[id];
    const ul = card.refs.failed;
    if (!f || !f.open) {
      ul.replaceChildren();
      return;
    }
    const items = f.items.map(function (t) { return el('li', {}, t); });
    if (f.loading) {
      items.push(el('li', { className: 'muted' }, 'loading…'));
    }
    if (f.error) {
      items.push(el('li', { className: 'error' }, f.error));
    }
    if (!f.loading && !f.error && !f.items.length) {
      items.push(el('li', { className: 'muted' }, 'no failed item in its results'));
    }
    ul.replaceChildren.apply(ul, items);
  }

  // ---- start ----

  document.addEventListener('DOMContentLoaded', function () {
    $('login').addEventListener('submit', function (e) {
      e.preventDefault();
      token = $('token').value.trim() || null;
      try {
        if (token) {
          sessionStorage.setItem(tokenKey, token);
        }
      } catch (err) {
        // kept for this page only
      }
      $('token').value = '';
      $('forget').hidden = !token;
      start();
    });
    $('forget').addEventListener('click', function () {
      try {
        sessionStorage.removeItem(tokenKey);
      } catch (e) {
        // nothing kept
      }
      token = null;
      askToken();
    });
    takeToken();
    start();
  });
})();
