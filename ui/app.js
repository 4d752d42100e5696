// mlxgate /ui: the live page. Plain JS, no build step, no dependency.
// Live data comes from two Server-Sent Events feeds (/ui/events and /ui/events/logs/{backend});
// actions are POSTs; the only GET is a request's detail. Server data is always written with
// textContent (a model name or a log line may contain markup).
'use strict';

(() => {
  // ---------------------------------------------------------------- helpers

  const $ = (sel, root = document) => root.querySelector(sel);
  const byTestId = (id, root = document) => root.querySelector(`[data-testid="${id}"]`);

  /** Makes an element: attrs are attributes, except `text` (textContent) and `class`. */
  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'text') node.textContent = v;
      else if (k === 'class') node.className = v;
      else node.setAttribute(k, v === true ? '' : v);
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  /** Sets a node's text only when it changed (keeps the DOM quiet at 2 updates/s). */
  function setText(node, text) {
    const t = text === null || text === undefined ? '' : String(text);
    if (node.textContent !== t) node.textContent = t;
  }

  const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
  const DASH = '–';

  function fmtNum(v, digits = 0) {
    if (!isNum(v)) return DASH;
    return v.toFixed(digits); // plain digits: a test (or a person copying) reads the number as is
  }

  function fmtDuration(seconds) {
    if (!isNum(seconds)) return DASH;
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} m ${s % 60} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} m`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  function fmtBytes(b) {
    if (!isNum(b)) return DASH;
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i += 1; }
    return `${b.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
  }

  const pad = (n, w = 2) => String(n).padStart(w, '0');

  function fmtClock(epochMs, withMs = false) {
    if (!isNum(epochMs)) return DASH;
    const d = new Date(epochMs);
    const hms = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    return withMs ? `${hms}.${pad(d.getMilliseconds(), 3)}` : hms;
  }

  const fmtAgo = (epochMs) => (isNum(epochMs) ? `${fmtDuration((Date.now() - epochMs) / 1000)} ago` : DASH);

  /** The message of an error answer: OpenAI shape `{"error":{"message"}}`, else the text. */
  function errorMessage(data, text, status) {
    const m = data && data.error && (data.error.message || data.error.type);
    if (m) return String(m);
    if (data && typeof data.message === 'string') return data.message;
    return (text && text.trim().slice(0, 300)) || `HTTP ${status}`;
  }

  /** Same-origin fetch with a JSON answer; a 401 shows the login form. */
  async function api(method, path, body) {
    const init = { method, headers: { accept: 'application/json' } };
    if (body !== undefined) {
      init.headers['content-type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      return { ok: false, status: 0, data: null, message: `network error: ${e.message}` };
    }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (res.status === 401 && path !== '/ui/login') Auth.showLogin();
    return { ok: res.ok, status: res.status, data, message: res.ok ? '' : errorMessage(data, text, res.status) };
  }

  /** Keeps a tbody's rows in the order of `items`, reusing each row by key (stable for clicks). */
  function syncRows(tbody, items, keyOf, make, update) {
    const old = new Map([...tbody.rows].map((r) => [r.dataset.key, r]));
    let prev = null;
    for (const item of items) {
      const key = keyOf(item);
      let row = old.get(key);
      if (row) old.delete(key);
      else { row = make(item); row.dataset.key = key; }
      update(row, item);
      const want = prev ? prev.nextSibling : tbody.firstChild;
      if (row !== want) tbody.insertBefore(row, want);
      prev = row;
    }
    old.forEach((r) => r.remove());
  }

  /** Keeps a select's options equal to `names`, keeping the current choice when it still exists. */
  function syncOptions(select, names, emptyLabel) {
    const current = [...select.options].filter((o) => !o.disabled).map((o) => o.value);
    if (current.length === names.length && current.every((v, i) => v === names[i])) return false;
    const keep = select.value;
    select.replaceChildren(...names.map((n) => el('option', { value: n, text: n })));
    if (!names.length && emptyLabel) select.append(el('option', { value: '', text: emptyLabel, disabled: true }));
    if (names.includes(keep)) select.value = keep;
    return select.value !== keep;
  }

  // ---------------------------------------------------------------- auth

  const Auth = {
    showLogin() {
      if (document.body.dataset.auth === 'login') return;
      document.body.dataset.auth = 'login';
      Live.close();
      Logs.close();
      byTestId('login-key').focus();
    },

    async submit(ev) {
      ev.preventDefault();
      const errorBox = byTestId('login-error');
      const button = byTestId('login-submit');
      setText(errorBox, '');
      button.disabled = true;
      const r = await api('POST', '/ui/login', { key: byTestId('login-key').value });
      button.disabled = false;
      if (r.status === 204 || r.ok) { Auth.reload(); return; }
      const defaults = {
        401: 'That key is not the admin key.',
        403: 'No admin key is configured on this gateway.',
        429: 'Too many failed attempts: wait a moment and try again.',
      };
      setText(errorBox, r.data && r.data.error ? r.message : defaults[r.status] || r.message);
    },

    async logout() {
      await api('POST', '/ui/logout');
      Auth.reload();
    },

    /** Loads /ui again (keeping the tab): the server decides what it shows. */
    reload() {
      if (window.location.pathname === '/ui') window.location.reload();
      else window.location.assign(`/ui${window.location.hash}`);
    },

    /** After a feed was refused: ask /ui itself what the server thinks of us. */
    async recheck() {
      try {
        const res = await fetch('/ui', { cache: 'no-store' });
        if (res.status === 401) { Auth.showLogin(); return false; }
        if (res.status === 403) { document.body.dataset.auth = 'forbidden'; Live.close(); return false; }
      } catch { /* the gateway is down: keep retrying */ }
      return true;
    },

    init() {
      $('#login-form').addEventListener('submit', (e) => Auth.submit(e));
      $('#logout').addEventListener('click', () => Auth.logout());
    },
  };

  // ---------------------------------------------------------------- tabs

  const Tabs = {
    names: ['now', 'activity', 'logs', 'playground'],
    current: null,

    select(name) {
      if (!Tabs.names.includes(name)) name = 'now';
      if (name === Tabs.current) return;
      const leaving = Tabs.current;
      Tabs.current = name;
      for (const n of Tabs.names) {
        byTestId(`view-${n}`).hidden = n !== name;
        byTestId(`tab-${n}`).setAttribute('aria-selected', String(n === name));
      }
      if (window.location.hash !== `#${name}`) history.replaceState(null, '', `#${name}`);
      if (leaving === 'logs') Logs.leave();
      if (name === 'logs') Logs.enter();
    },

    init() {
      for (const n of Tabs.names) byTestId(`tab-${n}`).addEventListener('click', () => Tabs.select(n));
      window.addEventListener('hashchange', () => Tabs.select(window.location.hash.slice(1)));
      Tabs.select(window.location.hash.slice(1));
    },
  };

  // ---------------------------------------------------------------- live feed (/ui/events)

  const Live = {
    es: null,
    retry: null,

    setLive(on) {
      const node = byTestId('live');
      const word = on ? 'live' : 'reconnecting';
      setText(node, word);
      node.dataset.live = word;
    },

    connect() {
      Live.close();
      const es = new EventSource('/ui/events');
      Live.es = es;
      es.onopen = () => Live.setLive(true);
      es.addEventListener('state', (e) => { Live.setLive(true); Now.render(JSON.parse(e.data)); });
      es.addEventListener('requests', (e) => Activity.backlog(JSON.parse(e.data)));
      es.addEventListener('request', (e) => Activity.add(JSON.parse(e.data)));
      es.addEventListener('lagged', (e) => Activity.lagged(JSON.parse(e.data).missed));
      es.onerror = () => {
        Live.setLive(false);
        // CONNECTING: the browser retries by itself. CLOSED: the server refused (401/403/404).
        if (es.readyState === EventSource.CLOSED) Live.reconnectLater();
      };
    },

    async reconnectLater() {
      Live.close();
      if (!(await Auth.recheck())) return;
      Live.retry = setTimeout(() => Live.connect(), 3000);
    },

    close() {
      clearTimeout(Live.retry);
      if (Live.es) Live.es.close();
      Live.es = null;
      Live.setLive(false);
    },
  };

  // ---------------------------------------------------------------- Now

  const SWAP_REASONS = {
    due: "the other's requests were due and it had held the GPU its residency",
    no_work: 'it had nothing to do',
    max_wait: "the other's oldest request would have missed its max_wait",
    stalled: 'none of its slots moved for swap_after',
    backoff: 'it was in crash backoff, holding no process',
    idle: 'it was idle',
    admin: 'an admin asked',
  };

  const Now = {
    state: null,
    received: 0,

    render(s) {
      Now.state = s;
      Now.received = Date.now();
      setText($('#meta-version'), s.version ? `v${s.version}` : '');
      $('#logout').hidden = !s.admin_key;
      setText($('#config-path'), s.config || '');
      Now.renderScheduler(s);
      Now.renderBackends(s.backends || []);
      Now.renderModels(s.models || []);
      Now.renderClients(s.clients || []);
      Now.renderSwaps(s.swaps || []);
      Now.tick();
      Logs.setBackends((s.backends || []).filter((b) => b.managed).map((b) => b.name));
      Playground.setModels((s.models || []).map((m) => m.name));
    },

    renderScheduler(s) {
      const sc = s.scheduler || {};
      const parts = [`auth ${s.auth || DASH}`];
      if (isNum(sc.swap_after_seconds)) parts.push(`swap after ${sc.swap_after_seconds} s`);
      if (isNum(sc.loading_share)) parts.push(`loading share ${Math.round(sc.loading_share * 100)} %`);
      parts.push(`GPU budget ${isNum(sc.gpu_memory_budget_bytes) ? fmtBytes(sc.gpu_memory_budget_bytes) : 'none'}`);
      setText($('#sched'), parts.join(' · '));
    },

    renderBackends(list) {
      syncRows($('#backends tbody'), list, (b) => b.name, Now.makeBackendRow, Now.updateBackendRow);
    },

    makeBackendRow(b) {
      const c = {
        name: el('td'),
        nameText: el('b'),
        kind: el('span', { class: 'sub' }),
        state: el('span', { class: 'badge', 'data-testid': 'backend-state' }),
        gpu: el('span', { class: 'badge gpu', 'data-testid': 'backend-gpu' }),
        health: el('span', { class: 'health' }),
        model: el('td', { class: 'clip' }),
        uptime: el('td', { class: 'r' }),
        restarts: el('td', { class: 'r', 'data-testid': 'backend-restarts' }),
        load: el('td', { class: 'r' }),
        queue: el('td', { class: 'r' }),
        footprint: el('td', { class: 'r' }),
        error: el('td', { class: 'err', 'data-testid': 'backend-error' }),
        acts: el('td', { class: 'acts' }),
      };
      const row = el('tr', { 'data-testid': 'backend-row', 'data-backend': b.name },
        c.name, el('td', {}, c.state, c.health), el('td', {}, c.gpu), c.model, c.uptime, c.restarts,
        c.load, c.queue, c.footprint, c.error, c.acts);
      row.cells_ = c;
      c.name.append(c.nameText, c.kind);
      const button = (action, label, cls) =>
        el('button', { class: `small ${cls || ''}`, 'data-action': action, 'data-backend': b.name, text: label });
      if (b.managed) c.acts.append(button('restart', 'Restart'), button('stop', 'Stop', 'danger'));
      c.drain = button('drain', 'Drain');
      c.acts.append(c.drain);
      return row;
    },

    updateBackendRow(row, b) {
      const c = row.cells_;
      setText(c.nameText, b.name);
      setText(c.kind, b.kind || '');
      c.name.title = b.url || '';
      setText(c.state, b.state);
      c.state.dataset.state = b.state || '';
      setText(c.gpu, b.holds_gpu ? 'GPU' : '');
      c.gpu.title = b.holds_gpu ? 'holds the GPU now' : '';
      setText(c.health, b.health && b.health !== 'healthy' ? b.health : '');
      c.health.className = `health ${b.health === 'ejected' ? 'bad' : 'warn'}`;
      setText(c.model, b.model || DASH);
      c.model.title = b.model || '';
      c.uptime.dataset.base = isNum(b.uptime_seconds) ? b.uptime_seconds : '';
      setText(c.restarts, isNum(b.restarts) ? b.restarts : b.managed ? 0 : DASH);
      const cap = isNum(b.max_concurrency) ? ` / ${b.max_concurrency}` : '';
      const abandoned = isNum(b.abandoned) && b.abandoned > 0 ? ` (+${b.abandoned} abandoned)` : '';
      setText(c.load, `${fmtNum(b.in_flight)}${cap}${abandoned}`);
      setText(c.queue, fmtNum(b.queue));
      const start = isNum(b.start_seconds) ? `${b.start_seconds.toFixed(1)} s · ` : '';
      setText(c.footprint, isNum(b.footprint_bytes) ? `${start}${fmtBytes(b.footprint_bytes)}` : start ? start.slice(0, -3) : DASH);
      c.footprint.title = 'measured start time · memory footprint';
      setText(c.error, b.last_error || '');
      c.error.title = b.last_error || '';
      const action = b.drained ? 'undrain' : 'drain';
      c.drain.dataset.action = action;
      setText(c.drain, b.drained ? 'Undrain' : 'Drain');
      const stop = $('button[data-action=stop]', c.acts);
      if (stop) stop.disabled = b.state === 'stopped';
    },

    renderModels(list) {
      syncRows($('#models tbody'), list, (m) => m.name, (m) => {
        const row = el('tr', { 'data-testid': 'model-row', 'data-model': m.name });
        for (const f of ['name', 'backends', 'policy', 'in_flight', 'queued', 'fallback', 'capture']) {
          const td = el('td', { 'data-field': f });
          if (f === 'in_flight') td.setAttribute('data-testid', 'model-in-flight');
          if (f === 'queued') td.setAttribute('data-testid', 'model-queued');
          if (f === 'in_flight' || f === 'queued') td.className = 'r';
          row.append(td);
        }
        return row;
      }, (row, m) => {
        const [name, backends, policy, inFlight, queued, fallback, capture] = row.cells;
        setText(name, m.name);
        name.style.fontWeight = '600';
        setText(backends, (m.backends || []).join(', '));
        setText(policy, m.policy || DASH);
        setText(inFlight, fmtNum(m.in_flight));
        setText(queued, fmtNum(m.queued));
        queued.classList.toggle('warn', isNum(m.queued) && m.queued > 0);
        setText(fallback, m.fallback || DASH);
        capture.replaceChildren(m.capture ? el('span', { class: 'badge c-warn', text: 'on', title: 'request bodies are kept (bounded)' }) : DASH);
      });
    },

    renderClients(list) {
      syncRows($('#clients tbody'), list, (c) => c.name, (c) => {
        const row = el('tr', { 'data-testid': 'client-row', 'data-client': c.name });
        row.append(el('td', { class: 'clip strong' }), el('td', { class: 'r', 'data-testid': 'client-in-flight' }));
        for (let i = 0; i < 4; i += 1) row.append(el('td', { class: 'r' }));
        return row;
      }, (row, c) => {
        const [name, inFlight, conc, rpm, tpm, limited] = row.cells;
        setText(name, c.name);
        name.title = c.name;
        setText(inFlight, fmtNum(c.in_flight));
        setText(conc, c.concurrency ?? DASH);
        setText(rpm, c.rpm ?? DASH);
        setText(tpm, c.tpm ?? DASH);
        setText(limited, fmtNum(c.rate_limited));
        limited.classList.toggle('warn', isNum(c.rate_limited) && c.rate_limited > 0);
      });
    },

    renderSwaps(swaps) {
      const last = swaps[0];
      const box = byTestId('last-swap');
      if (!last) {
        box.replaceChildren(el('span', { class: 'muted', text: 'No swap yet.' }));
      } else {
        box.replaceChildren(
          el('span', { class: 'muted', text: 'Last swap: ' }),
          el('span', { class: 'name', text: last.backend }),
          ' → ',
          el('span', { class: 'name', text: last.next || '(none)' }),
          ' · ',
          el('span', { class: 'badge c-teal', text: last.reason, title: SWAP_REASONS[last.reason] || '' }),
          el('span', { class: 'muted', text: ` ${SWAP_REASONS[last.reason] || ''} · ` }),
          el('span', { class: 'num', 'data-ago': last.at, text: fmtAgo(last.at) }),
        );
        box.title = new Date(last.at).toLocaleString();
      }
      syncRows($('#swaps tbody'), swaps, (s) => `${s.at}/${s.backend}`, () =>
        el('tr', {}, el('td', { class: 'num' }), el('td'), el('td'), el('td')),
      (row, s) => {
        const [when, out, into, reason] = row.cells;
        when.dataset.ago = s.at;
        when.title = fmtClock(s.at);
        setText(out, s.backend);
        setText(into, s.next || DASH);
        reason.replaceChildren(el('span', { class: 'badge c-teal', text: s.reason, title: SWAP_REASONS[s.reason] || '' }));
      });
    },

    /** Once a second: the clocks (uptimes and "ago") move between state events, no fetch. */
    tick() {
      if (!Now.state) return;
      const elapsed = (Date.now() - Now.received) / 1000;
      setText($('#meta-uptime'), fmtDuration(Now.state.uptime_seconds + elapsed));
      for (const row of $('#backends tbody').rows) {
        const cell = row.cells_.uptime;
        const base = cell.dataset.base;
        setText(cell, base === '' ? DASH : fmtDuration(Number(base) + elapsed));
      }
      for (const node of document.querySelectorAll('[data-ago]')) setText(node, fmtAgo(Number(node.dataset.ago)));
    },

    /** A backend button: act at once (no confirm()), the answer in [data-testid=action-result]. */
    async act(button) {
      const { action, backend } = button.dataset;
      const out = byTestId('action-result');
      button.disabled = true;
      setText(out, `${action} ${backend}…`);
      out.className = 'action-result';
      const r = await api('POST', `/admin/backends/${encodeURIComponent(backend)}/${action}`);
      button.disabled = false;
      if (!r.ok) {
        setText(out, `${action} ${backend}: ${r.message}`);
        out.className = 'action-result bad';
        return;
      }
      const d = r.data || {};
      const what = typeof d.drained === 'boolean' ? (d.drained ? 'drained' : 'undrained') : d.state || 'done';
      setText(out, `${action} ${backend} → ${what} (${fmtClock(Date.now())})`);
      out.className = 'action-result ok';
      // drain/undrain answer the BackendEntry: show it now rather than at the next state event.
      if (Now.state && d.name === backend) {
        const list = Now.state.backends.map((b) => (b.name === backend ? { ...b, ...d } : b));
        Now.state = { ...Now.state, backends: list };
        Now.renderBackends(list);
      }
    },

    init() {
      $('#backends tbody').addEventListener('click', (e) => {
        const button = e.target.closest('button[data-action]');
        if (button) Now.act(button);
      });
      Reload.init();
      setInterval(Now.tick, 1000);
    },
  };

  // ---------------------------------------------------------------- reload box

  const Reload = {
    async run(dryRun) {
      const check = byTestId('reload-check');
      const apply = byTestId('reload-apply');
      const out = byTestId('reload-result');
      check.disabled = true;
      apply.disabled = true;
      out.replaceChildren(el('span', { class: 'muted', text: dryRun ? 'Checking…' : 'Applying…' }));
      const r = await api('POST', dryRun ? '/admin/reload?dry_run=true' : '/admin/reload');
      check.disabled = false;
      const d = r.data;
      if (!d || typeof d.ok !== 'boolean') {
        out.replaceChildren(el('span', { class: 'bad', text: `error: ${r.message || 'unexpected answer'}` }));
        return;
      }
      out.replaceChildren(...Reload.describe(d, dryRun));
      apply.disabled = !(dryRun && d.ok);
    },

    describe(d, dryRun) {
      const nodes = [];
      const problems = d.problems || [];
      if (problems.length) {
        nodes.push(el('div', { class: 'bad', text: `${problems.length} problem${problems.length > 1 ? 's' : ''}: nothing changes.` }));
        nodes.push(el('ul', {}, ...problems.map((p) => el('li', { text: p }))));
      } else {
        nodes.push(el('div', { class: 'ok', text: d.applied ? 'Applied: no problems.' : 'No problems.' }));
      }
      const list = (v) => (v && v.length ? v.join(', ') : 'nothing');
      nodes.push(el('dl', {},
        el('dt', { text: d.applied ? 'applied now' : 'applies now' }), el('dd', { text: list(d.applies_now) }),
        el('dt', { text: 'needs a restart' }), el('dd', { text: list(d.needs_restart) }),
        el('dt', { text: 'file' }), el('dd', { text: d.config || DASH })));
      if (dryRun && d.ok) nodes.push(el('div', { class: 'muted', text: 'Apply to load it.' }));
      return nodes;
    },

    init() {
      byTestId('reload-check').addEventListener('click', () => Reload.run(true));
      byTestId('reload-apply').addEventListener('click', () => Reload.run(false));
    },
  };

  // ---------------------------------------------------------------- Activity

  const outcomeClass = (r) => (isNum(r.status) ? `s${String(r.status)[0]}` : '');

  /** The activity table's columns: [td's data-field, formatter, right-aligned]. */
  const COLUMNS = [
    ['time', (r) => fmtClock(r.at)],
    ['id', (r) => r.id],
    ['client', (r) => r.client ?? DASH],
    ['model', (r) => (r.fallback_from ? `${r.model} ← ${r.fallback_from}` : r.alias ? `${r.model} (${r.alias})` : r.model ?? DASH)],
    ['backend', (r) => r.backend ?? DASH],
    ['face', (r) => r.face ?? DASH],
    ['status', (r) => r.status ?? DASH, true],
    ['outcome', (r) => r.outcome ?? DASH],
    ['queue_ms', (r) => fmtNum(r.queue_ms, 1), true],
    ['ttft_ms', (r) => fmtNum(r.ttft_ms), true],
    ['decode_tps', (r) => (r.burst ? 'burst' : fmtNum(r.decode_tps, 1)), true],
    ['prompt_tokens', (r) => fmtNum(r.prompt_tokens), true],
    ['cached_tokens', (r) => fmtNum(r.cached_tokens), true],
    ['completion_tokens', (r) => fmtNum(r.completion_tokens), true],
    ['transform', (r) => r.transform ?? ''],
    ['duration_ms', (r) => fmtNum(r.duration_ms), true],
  ];

  /** A request's key: the gateway's sequence number (a client may send the same x-request-id twice). */
  const keyOf = (r) => (isNum(r.seq) ? `#${r.seq}` : String(r.id));

  const Activity = {
    max: 500,
    byKey: new Map(), // keyOf(r) → { r, row }
    pending: [],
    flushTimer: null,
    selected: null,
    query: '',

    makeRow(r) {
      const row = el('tr', { 'data-testid': 'activity-row', 'data-request-id': r.id, 'data-key': keyOf(r) });
      for (const [field, fmt, right] of COLUMNS) {
        row.append(el('td', { 'data-field': field, class: right ? 'r' : null, text: fmt(r) }));
      }
      row.querySelector('[data-field=id]').title = r.id;
      const tps = row.querySelector('[data-field=decode_tps]');
      if (r.burst) tps.classList.add('burst');
      const cls = outcomeClass(r);
      if (cls) {
        row.querySelector('[data-field=status]').classList.add(cls);
        row.querySelector('[data-field=outcome]').classList.add(cls);
      }
      if (r.transform) row.querySelector('[data-field=transform]').replaceChildren(el('span', { class: 'badge c-warn', text: r.transform }));
      row.hay = [r.id, r.client, r.model, r.alias, r.fallback_from, r.backend, r.outcome].filter(Boolean).join(' ').toLowerCase();
      row.hidden = !Activity.matches(row);
      if (keyOf(r) === Activity.selected) row.classList.add('selected');
      return row;
    },

    matches: (row) => !Activity.query || row.hay.includes(Activity.query),

    /** A finished request, live: batched so a busy gateway costs one DOM update per 100 ms. */
    add(r) {
      if (!r || !r.id || Activity.byKey.has(keyOf(r))) return;
      Activity.pending.push(r);
      if (Activity.pending.length > Activity.max) Activity.pending.splice(0, Activity.pending.length - Activity.max);
      if (!Activity.flushTimer) Activity.flushTimer = setTimeout(Activity.flush, 100);
    },

    flush() {
      Activity.flushTimer = null;
      const batch = Activity.pending.splice(0).filter((r) => !Activity.byKey.has(keyOf(r)));
      const frag = document.createDocumentFragment();
      for (let i = batch.length - 1; i >= 0; i -= 1) { // newest (last to arrive) first
        const row = Activity.makeRow(batch[i]);
        row.classList.add('fresh');
        Activity.byKey.set(keyOf(batch[i]), { r: batch[i], row });
        frag.append(row);
      }
      const tbody = $('#activity tbody');
      tbody.insertBefore(frag, tbody.firstChild);
      Activity.trim();
      Activity.count();
    },

    /** The backlog on (re)connect: merged with what is shown, newest first. */
    backlog(list) {
      const all = new Map([...Activity.byKey].map(([id, v]) => [id, v.r]));
      for (const r of list || []) if (r && r.id) all.set(keyOf(r), r);
      const sorted = [...all.values()].sort((a, b) => (b.at || 0) - (a.at || 0)).slice(0, Activity.max);
      const rows = sorted.map((r) => {
        const known = Activity.byKey.get(keyOf(r));
        return known ? known.row : Activity.makeRow(r);
      });
      Activity.byKey = new Map(sorted.map((r, i) => [keyOf(r), { r, row: rows[i] }]));
      $('#activity tbody').replaceChildren(...rows);
      Activity.count();
    },

    trim() {
      const tbody = $('#activity tbody');
      while (tbody.rows.length > Activity.max) {
        const row = tbody.lastElementChild;
        Activity.byKey.delete(row.dataset.key);
        row.remove();
      }
    },

    count() {
      const total = Activity.byKey.size;
      let shown = total;
      if (Activity.query) shown = [...Activity.byKey.values()].filter((v) => !v.row.hidden).length;
      setText($('#activity-count'), Activity.query ? `${shown} of ${total} requests` : `${total} requests`);
      $('#activity-empty').hidden = total > 0;
    },

    lagged(missed) {
      setText($('#activity-lagged'), `fell behind: ${missed} request${missed === 1 ? '' : 's'} not shown`);
    },

    filter(q) {
      Activity.query = q.trim().toLowerCase();
      for (const { row } of Activity.byKey.values()) row.hidden = !Activity.matches(row);
      Activity.count();
    },

    async open(key) {
      Activity.selected = key;
      for (const { row } of Activity.byKey.values()) row.classList.toggle('selected', row.dataset.key === key);
      const known = Activity.byKey.get(key);
      if (!known) return;
      Activity.renderDetail(known.r, undefined, 'loading…');
      const seq = isNum(known.r.seq) ? `?seq=${known.r.seq}` : '';
      const r = await api('GET', `/admin/requests/${encodeURIComponent(known.r.id)}${seq}`);
      if (Activity.selected !== key) return; // another row was clicked meanwhile
      if (r.ok && r.data) Activity.renderDetail(r.data, r.data.capture, '');
      else if (known) Activity.renderDetail(known.r, undefined, r.status === 404 ? 'no longer in the gateway’s ring: its summary only' : r.message);
    },

    renderDetail(r, capture, note) {
      const box = byTestId('request-detail');
      const dl = el('dl');
      for (const [k, v] of Object.entries(r)) {
        if (k === 'capture') continue;
        let text = v === null || v === undefined ? DASH : typeof v === 'object' ? JSON.stringify(v) : String(v);
        if ((k === 'at' || k === 'started') && isNum(v)) text = `${new Date(v).toLocaleString()} (${fmtClock(v, true)})`;
        if (k === 'decode_tps' && r.burst) text = `burst${isNum(v) ? ` (${v})` : ''}`;
        dl.append(el('dt', { text: k }), el('dd', { 'data-field': k, text }));
      }
      const close = el('button', { class: 'ghost small close', title: 'Close (Esc)', text: '✕' });
      close.addEventListener('click', Activity.closeDetail);
      const nodes = [close, el('h3', { text: 'Request', class: 'flush' }), el('div', { class: 'mono', text: r.id })];
      if (note) nodes.push(el('div', { class: 'muted small', text: note }));
      nodes.push(dl, el('h3', { text: 'Request body' }));
      if (capture && typeof capture.body === 'string') {
        nodes.push(el('pre', { 'data-field': 'capture', text: capture.body }));
        if (capture.truncated) nodes.push(el('div', { class: 'warn small', text: 'truncated (capture is bounded)' }));
      } else {
        nodes.push(el('div', { class: 'muted small', text: capture === undefined ? DASH : 'Not captured: request capture is off for this model.' }));
      }
      box.replaceChildren(...nodes);
      box.hidden = false;
    },

    closeDetail() {
      Activity.selected = null;
      byTestId('request-detail').hidden = true;
      for (const { row } of Activity.byKey.values()) row.classList.remove('selected');
    },

    init() {
      $('#activity tbody').addEventListener('click', (e) => {
        const row = e.target.closest('tr[data-key]');
        if (row) Activity.open(row.dataset.key);
      });
      byTestId('activity-filter').addEventListener('input', (e) => Activity.filter(e.target.value));
      document.addEventListener('keydown', (e) => { if (e.key === 'Escape') Activity.closeDetail(); });
      Activity.count();
    },
  };

  // ---------------------------------------------------------------- Logs

  const Logs = {
    max: 2000,
    es: null,
    backend: null,
    active: false,
    pending: [],
    flushTimer: null,
    lastAt: -1, // the newest line's time and how many lines had it: to skip the replay on reconnect
    atLast: 0,
    skip: null,

    setBackends(names) {
      const select = byTestId('log-backend');
      syncOptions(select, names, 'no managed backend');
      if (Logs.active && select.value !== (Logs.backend || '')) Logs.open(select.value);
    },

    enter() { Logs.active = true; Logs.open(byTestId('log-backend').value); },
    leave() { Logs.active = false; Logs.close(); },

    status(text) { setText($('#log-status'), text); },

    open(name) {
      Logs.close();
      Logs.clear();
      Logs.backend = name || null;
      if (!name) { Logs.status('no managed backend'); return; }
      Logs.status('connecting…');
      const es = new EventSource(`/ui/events/logs/${encodeURIComponent(name)}`);
      Logs.es = es;
      es.onopen = () => {
        Logs.status('live');
        Logs.skip = Logs.lastAt >= 0 ? { at: Logs.lastAt, n: Logs.atLast } : null;
      };
      es.addEventListener('line', (e) => Logs.receive(JSON.parse(e.data)));
      es.addEventListener('lagged', (e) => Logs.push({ at: Date.now(), text: `(${JSON.parse(e.data).missed} lines missed)`, mark: 'lagged' }));
      es.onerror = async () => {
        if (es.readyState !== EventSource.CLOSED) { Logs.status('reconnecting…'); return; }
        Logs.status('no log feed for this backend');
        if (Logs.es === es) Logs.es = null;
        await Auth.recheck();
      };
    },

    close() {
      if (Logs.es) Logs.es.close();
      Logs.es = null;
    },

    clear() {
      Logs.pending = [];
      Logs.lastAt = -1;
      Logs.atLast = 0;
      Logs.skip = null;
      $('#log-lines').replaceChildren();
      $('#log-follow').hidden = true;
    },

    /** A line from the feed; after a reconnect the server replays its last 200: skip those seen. */
    receive(line) {
      const at = line.at || 0;
      const skip = Logs.skip;
      if (skip) {
        if (at < skip.at) return;
        if (at === skip.at && skip.n > 0) { skip.n -= 1; return; }
        Logs.skip = null;
      }
      if (at === Logs.lastAt) Logs.atLast += 1;
      else { Logs.lastAt = at; Logs.atLast = 1; }
      Logs.push(line);
    },

    push(line) {
      Logs.pending.push(line);
      if (Logs.pending.length > Logs.max) Logs.pending.splice(0, Logs.pending.length - Logs.max);
      if (!Logs.flushTimer) Logs.flushTimer = setTimeout(Logs.flush, 50);
    },

    makeLine(line) {
      const node = el('div', { class: 'logline', 'data-testid': 'log-line', 'data-mark': line.mark || null },
        el('span', { class: 't', text: fmtClock(line.at, true) }));
      if (line.mark) node.append(el('span', { class: 'badge', text: line.mark }));
      node.append(el('span', { text: line.text }));
      return node;
    },

    flush() {
      Logs.flushTimer = null;
      const box = $('#log-lines');
      const follow = box.scrollTop + box.clientHeight >= box.scrollHeight - 24;
      const frag = document.createDocumentFragment();
      for (const line of Logs.pending.splice(0)) frag.append(Logs.makeLine(line));
      box.append(frag);
      while (box.childElementCount > Logs.max) box.firstElementChild.remove();
      if (follow) box.scrollTop = box.scrollHeight;
      $('#log-follow').hidden = follow;
    },

    init() {
      const box = $('#log-lines');
      byTestId('log-backend').addEventListener('change', (e) => { if (Logs.active) Logs.open(e.target.value); });
      box.addEventListener('scroll', () => {
        $('#log-follow').hidden = box.scrollTop + box.clientHeight >= box.scrollHeight - 24;
      });
      $('#log-follow').addEventListener('click', () => { box.scrollTop = box.scrollHeight; });
      $('#log-clear').addEventListener('click', () => { box.replaceChildren(); });
    },
  };

  // ---------------------------------------------------------------- Playground

  /** Reads an SSE body: calls onEvent({event, data}) per event; `data:` lines may span reads. */
  async function readSSE(body, onEvent) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buf = '';
    let event = '';
    let data = [];
    const line = (l) => {
      if (l === '') {
        if (data.length) onEvent({ event: event || 'message', data: data.join('\n') });
        event = '';
        data = [];
        return;
      }
      if (l.startsWith(':')) return;
      const i = l.indexOf(':');
      const field = i < 0 ? l : l.slice(0, i);
      let value = i < 0 ? '' : l.slice(i + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'data') data.push(value);
      else if (field === 'event') event = value;
    };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      const lines = buf.split(/\r\n|\n|\r/);
      buf = lines.pop();
      lines.forEach(line);
    }
    buf += decoder.decode();
    if (buf) line(buf);
    line('');
  }

  const Playground = {
    ctrl: null,
    run: null,

    setModels(names) { syncOptions(byTestId('pg-model'), names, 'no model'); },

    status(text, cls) {
      const node = byTestId('pg-status');
      setText(node, text);
      node.className = cls || '';
    },

    stats() {
      const m = Playground.run;
      setText(byTestId('pg-ttft'), m.first === null ? DASH : `${Math.round(m.first - m.t0)} ms`);
      const tokens = m.usage && isNum(m.usage.completion_tokens) ? m.usage.completion_tokens : m.deltas;
      const secs = m.first === null ? 0 : (m.last - m.first) / 1000;
      setText(byTestId('pg-tps'), secs > 0 ? `${(tokens / secs).toFixed(1)} tok/s` : DASH);
    },

    /** One SSE event of the answer. */
    onEvent(ev) {
      const m = Playground.run;
      if (ev.data === '[DONE]') { m.done = true; return; }
      let obj = null;
      try { obj = JSON.parse(ev.data); } catch { obj = null; }
      if (ev.event === 'error' || (obj && obj.error)) {
        m.failed = true;
        Playground.status(`error: ${errorMessage(obj, ev.data, 'stream')}`, 'bad');
        return;
      }
      if (!obj) return;
      if (obj.usage) m.usage = obj.usage;
      for (const choice of obj.choices || []) {
        const d = choice.delta || {};
        const piece = (d.reasoning_content || d.reasoning || '') + (d.content || '');
        if (choice.finish_reason) m.finished = true;
        if (!piece) continue;
        const now = performance.now();
        if (m.first === null) m.first = now;
        m.last = now;
        m.deltas += 1;
        m.text.appendData(piece);
      }
      Playground.stats();
    },

    async send() {
      if (Playground.ctrl) { Playground.ctrl.abort(); return; }
      const model = byTestId('pg-model').value;
      const content = byTestId('pg-input').value;
      const key = byTestId('pg-key').value.trim();
      if (key) sessionStorage.setItem('mlxgate.pg-key', key);
      else sessionStorage.removeItem('mlxgate.pg-key');
      const text = document.createTextNode('');
      byTestId('pg-output').replaceChildren(text);
      setText(byTestId('pg-request-id'), '');
      const m = { t0: performance.now(), first: null, last: null, deltas: 0, usage: null, text, done: false, finished: false, failed: false };
      Playground.run = m;
      Playground.stats();
      if (!model) { Playground.status('error: no model to ask', 'bad'); return; }
      const ctrl = new AbortController();
      Playground.ctrl = ctrl;
      setText(byTestId('pg-send'), 'Stop');
      Playground.status('streaming');
      try {
        await Playground.stream(model, content, key, ctrl.signal, m);
      } catch (e) {
        Playground.status(ctrl.signal.aborted ? 'error: stopped' : `error: ${e.message}`, 'bad');
      } finally {
        Playground.ctrl = null;
        setText(byTestId('pg-send'), 'Send');
      }
    },

    async stream(model, content, key, signal, m) {
      const headers = { 'content-type': 'application/json', accept: 'text/event-stream' };
      if (key) headers.authorization = `Bearer ${key}`;
      const body = {
        model, messages: [{ role: 'user', content }], stream: true,
        stream_options: { include_usage: true }, max_tokens: 256,
      };
      const res = await fetch('/v1/chat/completions', { method: 'POST', headers, body: JSON.stringify(body), signal });
      setText(byTestId('pg-request-id'), res.headers.get('x-request-id') || '');
      if (!res.ok) {
        const t = await res.text();
        let data = null;
        try { data = JSON.parse(t); } catch { data = null; }
        Playground.status(`error: ${errorMessage(data, t, res.status)}`, 'bad');
        return;
      }
      await readSSE(res.body, Playground.onEvent);
      Playground.stats();
      if (m.failed) return;
      if (m.done || m.finished) Playground.status('done', 'ok');
      else Playground.status('error: the stream ended early', 'bad');
    },

    init() {
      const key = sessionStorage.getItem('mlxgate.pg-key');
      if (key) byTestId('pg-key').value = key;
      $('#pg-form').addEventListener('submit', (e) => { e.preventDefault(); Playground.send(); });
      byTestId('pg-input').addEventListener('keydown', (e) => {
        if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); Playground.send(); }
      });
    },
  };

  // ---------------------------------------------------------------- start

  function start() {
    Auth.init();
    if (document.body.dataset.auth === 'login') { byTestId('login-key').focus(); return; }
    if (document.body.dataset.auth === 'forbidden') return;
    Tabs.init();
    Now.init();
    Activity.init();
    Logs.init();
    Playground.init();
    Live.connect();
    // A hidden tab holds no connection: a browser opens at most six to one host, and a few
    // tabs left open would otherwise leave none for the buttons and the playground.
    document.addEventListener('visibilitychange', () => {
      if (document.hidden) {
        Live.close();
        if (Logs.active) Logs.close();
      } else {
        Live.connect();
        if (Logs.active) Logs.open(byTestId('log-backend').value);
      }
    });
  }

  start();
})();
