// edgefl console: renders the aggregator's /status and keeps it current by
// polling (every POLL_MS, asking only for the rounds it lacks). No framework,
// no build step; every value goes into the page as text, never as markup.
(function () {
  'use strict';
  // POLL_MS while the page is shown, HIDDEN_MS while its tab is in the
  // background (it catches up at once when shown again).
  var POLL_MS = 1500, HIDDEN_MS = 15000, KEEP = 1000, SVGNS = 'http://www.w3.org/2000/svg';
  var $ = function (id) { return document.getElementById(id); };

  var st = JSON.parse($('initial').textContent);
  var rounds = [], evals = [], runId = null, offset = 0, lastOK = Date.now(), failing = false;

  // ---- data ----

  function absorb(s, full) {
    if (full || s.run_id !== runId) { rounds = []; evals = []; runId = s.run_id; }
    var live = s.live || {};
    (live.history || []).forEach(function (r) { put(rounds, r); });
    (live.evaluations || []).forEach(function (e) { put(evals, e); });
    if (live.now) { offset = Date.parse(live.now) - Date.now(); }
    st = s;
  }

  // put inserts or replaces rec in list, ascending by round, at most KEEP.
  function put(list, rec) {
    var i = list.length;
    while (i > 0 && list[i - 1].round > rec.round) { i--; }
    if (i > 0 && list[i - 1].round === rec.round) { list[i - 1] = rec; return; }
    list.splice(i, 0, rec);
    if (list.length > KEEP) { list.splice(0, list.length - KEEP); }
  }

  function last(list) { return list.length ? list[list.length - 1].round : -1; }

  var timer = null;
  function schedule(ms) {
    clearTimeout(timer);
    timer = setTimeout(poll, document.hidden ? Math.max(ms, HIDDEN_MS) : ms);
  }
  document.addEventListener('visibilitychange', function () { if (!document.hidden) { schedule(0); } });

  function poll() {
    timer = null;
    var url = '/status?compact=1&rounds_after=' + last(rounds) + '&evals_after=' + last(evals);
    fetch(url, { cache: 'no-store', credentials: 'same-origin' }).then(function (resp) {
      if (!resp.ok) { throw new Error('HTTP ' + resp.status); }
      return resp.json();
    }).then(function (s) {
      var newRun = s.run_id !== runId;
      absorb(s, false);
      lastOK = Date.now(); failing = false;
      render();
      schedule(newRun ? 0 : POLL_MS);
    }).catch(function () {
      failing = true; tick();
      schedule(POLL_MS);
    });
  }

  // ---- formatting ----

  function now() { return Date.now() + offset; }
  function dur(ms) {
    var s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) { return s + ' s'; }
    var m = Math.floor(s / 60); s %= 60;
    if (m < 60) { return m + ' min' + (s ? ' ' + s + ' s' : ''); }
    var h = Math.floor(m / 60); m %= 60;
    if (h < 48) { return h + ' h' + (m ? ' ' + m + ' min' : ''); }
    return Math.floor(h / 24) + ' d ' + (h % 24) + ' h';
  }
  function ago(iso) { return iso ? dur(now() - Date.parse(iso)) + ' ago' : '-'; }
  function clock(iso) {
    var d = new Date(iso);
    return isNaN(d) ? '-' : d.toLocaleString(undefined, { month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit' });
  }
  function num(v, p) {
    if (v === null || v === undefined || !isFinite(v)) { return '-'; }
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) { return Number(v).toExponential((p || 4) - 1).replace(/\.?0+e/, 'e'); }
    return Number(v).toPrecision(p || 4).replace(/(\.\d*?)0+$/, '$1').replace(/\.$/, '');
  }
  function bytes(v) {
    if (v === null || v === undefined) { return '-'; }
    var u = ['B', 'kB', 'MB', 'GB', 'TB'], i = 0;
    while (v >= 1000 && i < u.length - 1) { v /= 1000; i++; }
    return (i ? v.toFixed(v < 10 ? 1 : 0) : v) + ' ' + u[i];
  }
  function scoreName() { var n = st.live && st.live.score_name; return n === 'r2' ? 'R²' : 'accuracy'; }

  function text(el, t) { if (el && el.textContent !== t) { el.textContent = t; } }
  function el(tag, cls, t) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (t !== undefined) { e.textContent = t; }
    return e;
  }

  // ---- the page ----

  var OPEN = { statistics: 1, collecting: 1, waiting: 1, stalled: 1, closing: 1, fitting: 1, finishing: 1 };

  function tick() {
    var age = Date.now() - lastOK;
    var live = $('live');
    text(live, failing ? 'no answer from the aggregator for ' + dur(age) + ' — retrying' : 'updated ' + dur(age) + ' ago');
    live.classList.toggle('stale', failing);
    if (st.round_opened_at && OPEN[st.phase]) {
      var rt = dur(now() - Date.parse(st.round_opened_at));
      if (st.live && st.live.round_timeout_seconds) { rt += ' (timeout ' + dur(st.live.round_timeout_seconds * 1000) + ')'; }
      text($('round-time'), rt);
    } else {
      text($('round-time'), st.phase === 'finished' ? 'run ended' : '-');
    }
    if (st.deadline) {
      var left = Date.parse(st.deadline) - now();
      text($('deadline'), clock(st.deadline) + (left >= 0 ? ' (in ' + dur(left) + ')' : ' (passed ' + dur(-left) + ' ago)'));
    } else {
      text($('deadline'), '-');
    }
    document.querySelectorAll('#sites tr[data-site]').forEach(function (tr) {
      var c = tr._client;
      if (c) { text(tr.querySelector('.seen'), ago(c.last_seen)); }
    });
  }

  function render() {
    var live = st.live || {};
    text($('federation'), st.federation || '');
    document.title = (st.federation ? st.federation + ' · ' : '') + 'round ' + st.round + ' · edgefl console';
    var badge = $('phase-badge');
    text(badge, st.phase); badge.className = 'phase ' + st.phase;
    text($('round'), String(st.round));
    text($('round-of'), live.rounds ? 'of ' + live.rounds : '(no limit)');
    var bar = $('round-bar').firstElementChild;
    var frac = live.rounds ? Math.min(1, (st.phase === 'finished' ? live.rounds : st.round - 1) / live.rounds) : 0;
    bar.style.width = (100 * frac).toFixed(1) + '%';
    text($('phase'), st.phase + (st.stop_reason ? ' (' + st.stop_reason + ')' : ''));
    text($('fedsplit-health'), st.fedsplit_diverging_since ? 'diverging since round ' + st.fedsplit_diverging_since :
      (st.fedsplit_non_finite ? st.fedsplit_non_finite + ' non-finite steps kept out' : '-'));
    text($('quorum'), live.per_round ? live.quorum + ' of ' + live.per_round + ' selected (' + Math.round(100 * live.quorum_fraction) + ' %)' : '-');
    var clients = st.clients || [];
    var online = clients.filter(function (c) { return c.online; }).length;
    text($('online'), online + ' of ' + clients.length + (st.selected ? ' · ' + (st.received || []).length + ' of ' + st.selected.length + ' reported' : ''));
    text($('algorithm'), (st.algorithm || '-') + (st.aggregator ? ' · ' + st.aggregator : ''));
    text($('codec'), (st.codec ? 'up ' + st.codec : '') + (st.downlink ? ' · down ' + st.downlink : ''));
    text($('run-id'), st.run_id || '-');
    var m = st.model;
    text($('model'), m ? m.kind + ', ' + m.inputs + ' inputs' + (m.classes ? ', ' + m.classes + ' classes' : '') : '-');
    text($('schema'), st.schema ? st.schema.slice(0, 16) + '…' : 'none');
    var pr = st.privacy;
    text($('privacy'), pr ? pr.mode + ': epsilon ' + Number(pr.epsilon.toPrecision(4)) + ' at delta ' + pr.delta + ' after ' + pr.rounds + ' rounds' +
      (pr.epsilon_budget ? ' (budget ' + pr.epsilon_budget + ')' : '') : 'off');
    renderAttention();
    renderParams(live.params || {});
    renderReview();
    renderBundle();
    // Under --dp the sites' figures are the operator's only: no bundle carries them
    // (docs/privacy.md, "Evaluation under DP").
    var evWhat = st.schema ? (pr ? 'Federated evaluation (operator only, not in any bundle)' : 'Federated evaluation') : 'Evaluation on --eval-data';
    text($('loss-title'), evWhat + ': loss');
    text($('score-title'), evWhat + ': ' + scoreName());
    renderCharts();
    renderSites(clients);
    tick();
  }

  // The broker connection and what needs the operator: a statistics phase
  // past its deadline below quorum (who is missing and why), connections
  // refused for identities that are not sites.
  function renderAttention() {
    var b = st.broker;
    text($('broker'), !b ? '-' : b.connected ? 'connected' + (b.since ? ' since ' + clock(b.since) : '') :
      'NOT connected' + (b.last_error ? ': ' + b.last_error : '') + (b.since ? ' (since ' + clock(b.since) + ')' : '') + ' — sites\' liveness unknown');
    $('broker').classList.toggle('bad', !!b && !b.connected);
    var notes = [], o = st.statistics_overdue;
    if (o) {
      notes.push('statistics phase past its deadline below quorum (' + (o.received || []).length + ' of ' + o.quorum + '): ' +
        (o.missing || []).map(function (m) { return m.id + ': ' + m.why; }).join('; '));
    }
    (st.refused || []).forEach(function (r) {
      notes.push('refused ' + (r.id || '(no identity)') + ': ' + r.reason + ' (' + ago(r.at) + ', ' + r.count + '×)');
    });
    var box = $('attention'), sig = notes.join('\n');
    $('attention-box').hidden = !notes.length;
    if (box.dataset.v === sig) { return; }
    box.dataset.v = sig; box.textContent = '';
    notes.forEach(function (n) { box.appendChild(el('span', 'note', n)); });
  }

  function renderParams(p) {
    var box = $('params'), keys = Object.keys(p).sort();
    var sig = keys.map(function (k) { return k + '=' + p[k]; }).join(' ');
    if (box._sig === sig) { return; }
    box._sig = sig; box.textContent = '';
    keys.forEach(function (k) { box.appendChild(el('span', '', k + '=' + p[k])); });
  }

  // The statistics review (values that differ between sites), once the
  // preprocessing is fitted; --stats-review stops the run before round 1.
  function renderReview() {
    var r = st.statistics_review, card = $('review-card');
    var found = r && r.findings && r.findings.length ? r.findings : [];
    card.hidden = found.length === 0;
    if (!found.length) { return; }
    text($('review-note'), found.length + ' findings from the sites\' statistics' + (r.stopped ?
      '; the run stopped before round 1 (--stats-review): fix the schema and start a new run, or restart without --stats-review' : ''));
    var ul = $('review-findings'), sig = found.join('\n');
    if (ul._sig === sig) { return; }
    ul._sig = sig; ul.textContent = '';
    found.forEach(function (f) { ul.appendChild(el('li', '', f)); });
  }

  function renderBundle() {
    var b = st.final_bundle, card = $('bundle-card');
    card.hidden = !b;
    if (!b) { return; }
    text($('bundle-digest'), b.digest);
    text($('bundle-round'), String(b.round));
    text($('bundle-bytes'), String(b.bytes));
  }

  function renderSites(clients) {
    var tb = $('sites').tBodies[0];
    var rows = {};
    Array.prototype.forEach.call(tb.rows, function (tr) { rows[tr.dataset.site] = tr; });
    var prev = null;
    clients.forEach(function (c) {
      var tr = rows[c.id];
      if (!tr) { tr = newRow(c.id); }
      delete rows[c.id];
      fillRow(tr, c);
      var want = prev ? prev.nextSibling : tb.firstChild;
      if (tr !== want) { tb.insertBefore(tr, want); }
      prev = tr;
    });
    Object.keys(rows).forEach(function (id) { tb.removeChild(rows[id]); });
  }

  var COLS = [['id', 'Site'], ['state', 'State'], ['seen', 'Last seen'], ['num rounds', 'Rounds'], ['num straggled', 'Straggled'],
    ['num partial', 'Partial'], ['num gamma', 'Last γ'], ['num epochs', 'Epochs'], ['eval', 'Last evaluation'],
    ['rejections', 'Rejections'], ['num capped', 'Samples capped'], ['fedsplit', 'FedSplit bound'], ['error', 'Error']];

  function newRow(id) {
    var tr = el('tr');
    tr.dataset.site = id;
    COLS.forEach(function (c) { var td = el('td', c[0]); td.dataset.label = c[1]; tr.appendChild(td); });
    return tr;
  }

  function fillRow(tr, c) {
    tr._client = c;
    tr.classList.toggle('failing', !!c.error);
    var q = function (cls) { return tr.querySelector('.' + cls); };
    var idc = q('id'), idSig = c.id + (c.not_in_preprocessing ? '\n' : '');
    if (idc.dataset.v !== idSig) {
      idc.dataset.v = idSig; idc.textContent = c.id;
      if (c.not_in_preprocessing) { idc.appendChild(el('span', 'sub', 'not in the preprocessing (joined after the statistics phase)')); }
    }
    var state = q('state'), on = c.online ? 'online' : 'offline';
    var label = c.online ? 'online' : c.liveness_unknown ? 'unknown' : c.never_connected ? 'never connected' : 'offline';
    state.className = 'state ' + on;
    if (state.dataset.v !== label) {
      state.dataset.v = label; state.textContent = '';
      state.appendChild(el('span', 'dot')); state.appendChild(document.createTextNode(label));
    }
    text(q('seen'), ago(c.last_seen));
    text(q('rounds'), String(c.participation || 0));
    text(q('straggled'), String(c.straggled || 0));
    text(q('partial'), String(c.partial || 0));
    text(q('capped'), String(c.samples_capped || 0));
    var w = c.last_work;
    text(q('gamma'), w ? num(w.gamma, 3) : '-');
    text(q('epochs'), w ? String(w.epochs) + (w.partial ? ' (partial)' : '') : '-');
    var e = c.last_eval, ev = q('eval');
    var evSig = e ? JSON.stringify(e) : '-';
    if (ev.dataset.v !== evSig) {
      ev.dataset.v = evSig; ev.textContent = '';
      if (e) {
        ev.appendChild(document.createTextNode('loss ' + num(e.loss) + (e.score !== undefined && e.score !== null ? ' · ' + scoreName() + ' ' + num(e.score, 3) : '') +
          (e.balanced_accuracy !== undefined ? ' · balanced ' + num(e.balanced_accuracy, 3) : '') +
          (e.baseline !== undefined ? ' · majority-class baseline ' + num(e.baseline, 3) : '')));
        if (e.below_baseline) { ev.appendChild(el('span', 'below', e.baseline !== undefined ? 'does not beat the majority-class baseline' : 'R² not above 0: no better than the mean')); }
        ev.appendChild(el('span', 'sub', 'round ' + e.round + ', n ' + e.n));
      } else { ev.textContent = '-'; }
    }
    var rj = q('rejections'), r = c.rejections || {}, keys = Object.keys(r).sort();
    var rjSig = keys.map(function (k) { return k + r[k]; }).join();
    if (rj.dataset.v !== rjSig) {
      rj.dataset.v = rjSig; rj.textContent = keys.length ? '' : '-';
      keys.forEach(function (k) { rj.appendChild(el('span', k === 'duplicate' ? 'rej benign' : 'rej', k + ' ' + r[k])); });
    }
    var fs = q('fedsplit'), f = c.fedsplit, fsSig = f ? JSON.stringify(f) : '-';
    if (fs.dataset.v !== fsSig) {
      fs.dataset.v = fsSig; fs.textContent = '-';
      if (f) {
        fs.textContent = (f.aside_now ? 'left out' : 'in') + ' · clipped ' + (f.clipped_rounds || 0) + ', left out ' + (f.aside_rounds || 0);
        fs.appendChild(el('span', 'msg', (f.reason || '') + (f.rounds && f.rounds.length ? ' (rounds ' + f.rounds.join(' ') + ')' : '')));
      }
    }
    var rf = c.last_refusal, er = q('error');
    var erSig = c.error ? c.error.reason + '\n' + c.error.message : rf ? 'refused\n' + rf.reason + rf.at + rf.count : '-';
    if (er.dataset.v !== erSig) {
      er.dataset.v = erSig; er.textContent = c.error ? c.error.reason || 'error' : rf ? 'refused by the broker' : '-';
      if (c.error) { er.appendChild(el('span', 'msg', c.error.message)); }
      if (!c.error && rf) { er.appendChild(el('span', 'msg', rf.reason + ' (' + clock(rf.at) + ', ' + rf.count + '×)')); }
    }
  }

  // ---- charts (inline SVG) ----

  function renderCharts() {
    var sites = {};
    evals.forEach(function (e) { Object.keys(e.sites || {}).forEach(function (id) { sites[id] = true; }); });
    var ids = Object.keys(sites).sort();
    var perSite = function (f) {
      return ids.map(function (id) {
        return { cls: 'site', name: id, pts: evals.map(function (e) { var s = (e.sites || {})[id]; return [e.round, s ? f(s) : null]; }) };
      });
    };
    var loss = function (x) { return x.loss; };
    var score = function (x) { return x.score === undefined ? null : x.score; };
    var evTitle = function (what) { return function (p) { return 'round ' + p[0] + ': ' + what + ' ' + num(p[1]); }; };
    draw('chart-loss', perSite(loss).concat([{ cls: 'fed', name: 'federation', dots: true, title: evTitle('loss'),
      pts: evals.map(function (e) { return [e.round, e.federation.loss]; }) }]), {});
    draw('chart-score', perSite(score).concat([{ cls: 'fed', name: 'federation', dots: true, title: evTitle(scoreName()),
      pts: evals.map(function (e) { return [e.round, score(e.federation)]; }) }]), {});
    draw('chart-delta', [{ cls: 'delta', name: '‖xᵗ⁺¹ − xᵗ‖', dots: true, title: function (p) { return 'round ' + p[0] + ': ' + num(p[1]); },
      pts: rounds.map(function (r) { return [r.round, r.delta_norm === undefined ? null : r.delta_norm]; }) }], { log: true });
    var bt = function (what) { return function (p) { return 'round ' + p[0] + ': ' + what + ' ' + bytes(p[1]); }; };
    draw('chart-bytes', [
      { cls: 'up', name: 'up (from the sites)', dots: true, title: bt('up'), pts: rounds.map(function (r) { return [r.round, r.bytes_up === undefined ? null : r.bytes_up]; }) },
      { cls: 'down', name: 'down (to the sites)', dots: true, title: bt('down'), pts: rounds.map(function (r) { return [r.round, r.bytes_down === undefined ? null : r.bytes_down]; }) }
    ], { fmt: bytes, zero: true });
  }

  function ticks(lo, hi, n) {
    var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / n)));
    var err = span / n / step;
    if (err >= 7.5) { step *= 10; } else if (err >= 3.5) { step *= 5; } else if (err >= 1.5) { step *= 2; }
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) { out.push(Math.abs(v) < step * 1e-9 ? 0 : v); }
    return out;
  }

  // logTicks are the log10 of 1, 2 and 5 times the powers of ten in
  // [lo, hi] (log10 values), or of the powers alone when those are many.
  function logTicks(lo, hi) {
    var out = [], pow = [];
    for (var k = Math.floor(lo); k <= Math.ceil(hi); k++) {
      [1, 2, 5].forEach(function (m) {
        var v = Math.log10(m) + k;
        if (v >= lo && v <= hi) { out.push(v); if (m === 1) { pow.push(v); } }
      });
    }
    if (out.length > 7) { out = pow; }
    if (out.length > 7) { var step = Math.ceil(out.length / 6); out = out.filter(function (v, i) { return i % step === 0; }); }
    return out;
  }

  function svg(tag, attrs, t) {
    var e = document.createElementNS(SVGNS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (t !== undefined) { e.textContent = t; }
    return e;
  }

  function draw(id, series, opt) {
    var box = document.querySelector('#' + id + ' .plot');
    var pts = [];
    series.forEach(function (s) { s.pts.forEach(function (p) { if (p[1] !== null && isFinite(p[1]) && (!opt.log || p[1] > 0)) { pts.push(p); } }); });
    var sig = JSON.stringify(series.map(function (s) { return s.pts; }));
    if (box._sig === sig) { return; }
    box._sig = sig; box.textContent = '';
    if (!pts.length) { box.appendChild(el('div', 'empty', 'nothing to show yet')); return; }
    var W = 600, H = 230, L = 56, R = 10, T = 10, B = 26;
    var xs = pts.map(function (p) { return p[0]; }), ys = pts.map(function (p) { return opt.log ? Math.log10(p[1]) : p[1]; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (opt.zero && !opt.log) { y0 = Math.min(0, y0); }
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { var d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    var pad = (y1 - y0) * 0.06; y1 += pad; if (!(opt.zero && y0 === 0)) { y0 -= pad; }
    var X = function (v) { return L + (v - x0) / (x1 - x0) * (W - L - R); };
    var Y = function (v) { return T + (1 - (v - y0) / (y1 - y0)) * (H - T - B); };
    var g = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, role: 'img', 'aria-label': id });
    var fmt = opt.fmt || function (v) { return num(v, 3); };
    var yt = opt.log ? logTicks(y0, y1) : ticks(y0, y1, 4);
    yt.forEach(function (v) {
      g.appendChild(svg('line', { 'class': 'grid', x1: L, x2: W - R, y1: Y(v), y2: Y(v) }));
      g.appendChild(svg('text', { x: L - 6, y: Y(v) + 3, 'text-anchor': 'end' }, opt.log ? num(Math.pow(10, v), 2) : fmt(v)));
    });
    ticks(x0, x1, 6).filter(function (v) { return v === Math.round(v); }).forEach(function (v) {
      g.appendChild(svg('text', { x: X(v), y: H - 8, 'text-anchor': 'middle' }, String(v)));
    });
    g.appendChild(svg('line', { 'class': 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B }));
    g.appendChild(svg('line', { 'class': 'axis', x1: L, x2: L, y1: T, y2: H - B }));
    g.appendChild(svg('text', { x: L - 6, y: H - 8, 'text-anchor': 'end' }, 'round'));
    var legend = el('div', 'legend'), shown = {};
    series.forEach(function (s) {
      var dpath = '', pen = false;
      s.pts.forEach(function (p) {
        var ok = p[1] !== null && isFinite(p[1]) && (!opt.log || p[1] > 0);
        if (!ok) { pen = false; return; }
        var y = opt.log ? Math.log10(p[1]) : p[1];
        dpath += (pen ? 'L' : 'M') + X(p[0]).toFixed(1) + ' ' + Y(y).toFixed(1);
        pen = true;
      });
      var path = svg('path', { 'class': 'series ' + s.cls, d: dpath || 'M0 0' });
      path.appendChild(svg('title', {}, s.name));
      g.appendChild(path);
      if (s.dots) {
        s.pts.forEach(function (p) {
          if (p[1] === null || !isFinite(p[1]) || (opt.log && p[1] <= 0)) { return; }
          var c = svg('circle', { 'class': 'pt ' + s.cls, cx: X(p[0]).toFixed(1), cy: Y(opt.log ? Math.log10(p[1]) : p[1]).toFixed(1), r: 3.2, 'data-round': p[0] });
          c.appendChild(svg('title', {}, s.title ? s.title(p) : String(p[1])));
          g.appendChild(c);
        });
      }
      var key = s.cls === 'site' ? 'site' : s.name;
      if (!shown[key]) {
        shown[key] = true;
        var item = el('span');
        item.appendChild(el('i', s.cls));
        item.appendChild(document.createTextNode(s.cls === 'site' ? 'each site' : s.name));
        legend.appendChild(item);
      }
    });
    box.appendChild(g);
    box.appendChild(legend);
  }

  absorb(st, true);
  render();
  setInterval(tick, 1000);
  schedule(POLL_MS);
}());
