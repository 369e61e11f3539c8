/* The platform dashboard's behaviour: live status, charts (uPlot), log follow, uploads.
 * Plain browser JavaScript, no build step. Text from the server is only ever set with
 * textContent, never parsed as HTML. */
"use strict";

(function () {
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(
      function (answer) {
        if (!answer.ok) throw new Error(url + " answered " + answer.status);
        return answer.json();
      }
    );
  }

  function postJSON(url, body) {
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify(body),
    }).then(function (answer) {
      return answer.json().then(function (data) {
        if (!answer.ok) throw new Error(data.message || url + " answered " + answer.status);
        return data;
      });
    });
  }

  function number(value, digits) {
    if (value === null || value === undefined) return "—";
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    const size = Math.abs(value);
    if (size < 0.001 || size >= 1e7) return value.toExponential(2);  // a learning rate, say
    return value.toFixed(digits === undefined ? 3 : digits);
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "—";
    if (ms < 1000) return Math.floor(ms) + " ms";
    if (ms < 10000) return (ms / 1000).toFixed(1) + "s";
    const seconds = Math.floor(ms / 1000);
    const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
    const pad = function (v) { return String(v).padStart(2, "0"); };
    if (h) return h + "h " + pad(m) + "m " + pad(s) + "s";
    return m ? m + "m " + pad(s) + "s" : s + "s";
  }

  function setStatus(element, status) {
    if (!element) return;
    element.textContent = status;
    element.className = "status status-" + status;
  }

  // --- workspace switch ----------------------------------------------------------------------
  const switcher = document.getElementById("workspace-switch");
  if (switcher) {
    switcher.addEventListener("change", function () { window.location.assign(switcher.value); });
  }

  // --- a form that asks first (undeploy): an inline question, not a browser dialog ----------
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (form.dataset.confirmed === "true") return;
      event.preventDefault();
      if (form.querySelector(".confirm")) return;
      const ask = document.createElement("span");
      ask.className = "confirm";
      ask.setAttribute("data-test", "confirm-prompt");
      ask.textContent = form.dataset.confirm + " ";
      const yes = document.createElement("button");
      yes.type = "button";
      yes.textContent = "Yes, undeploy";
      yes.setAttribute("data-test", "confirm-yes");
      const no = document.createElement("button");
      no.type = "button";
      no.textContent = "Cancel";
      no.setAttribute("data-test", "confirm-cancel");
      yes.addEventListener("click", function () {
        form.dataset.confirmed = "true";
        form.submit();
      });
      no.addEventListener("click", function () { ask.remove(); });
      ask.appendChild(yes);
      ask.appendChild(document.createTextNode(" "));
      ask.appendChild(no);
      form.appendChild(ask);
    });
  });

  // --- runs list: live status ------------------------------------------------------------------
  const runsTable = document.getElementById("runs-table");
  if (runsTable) {
    const pollRuns = function () {
      const rows = Array.from(runsTable.querySelectorAll("tr[data-active='true']"));
      if (!rows.length) return;
      const ids = rows.map(function (row) { return row.dataset.runId; });
      getJSON(runsTable.dataset.statusUrl + "?ids=" + encodeURIComponent(ids.join(",")))
        .then(function (states) {
          rows.forEach(function (row) {
            const state = states[row.dataset.runId];
            if (!state) return;
            setStatus(row.querySelector("[data-field='status']"), state.status);
            const result = row.querySelector("[data-field='reward']");
            result.textContent = state.result === null ? "—"
              : (state.result_kind === "pass rate" ? (state.result * 100).toFixed(1) + "%" : number(state.result)) +
                " " + state.result_kind;
            const progress = row.querySelector("[data-field='progress']");
            const p = state.progress;
            progress.textContent = number(p.done) + " / " + number(p.total) +
              (p.percent === null ? "" : " (" + p.percent + "%)");
            row.querySelector("[data-field='duration']").textContent = duration(state.duration_ms);
            row.dataset.active = state.active ? "true" : "false";
          });
        })
        .catch(function () { /* the next poll tries again */ })
        .finally(function () { window.setTimeout(pollRuns, 5000); });
    };
    window.setTimeout(pollRuns, 5000);
  }

  // --- charts ------------------------------------------------------------------------------------
  const palette = ["#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#dc2626"];

  function plotWidth(element) {
    return Math.max(240, element.clientWidth || element.parentElement.clientWidth - 20 || 480);
  }

  // The y-range from the data: a small margin around [min, max]; a flat series gets a band
  // around its value (an all-zero series reads 0..1, not uPlot's default 0..100).
  function dataRange(u, low, high) {
    if (low === null || high === null || !isFinite(low) || !isFinite(high)) return [0, 1];
    if (low === high) {
      if (low === 0) return [0, 1];
      const pad = Math.abs(low) * 0.1;
      return [low - pad, high + pad];
    }
    const pad = (high - low) * 0.05;
    return [low - pad, high + pad];
  }

  // Steps are whole numbers: ticks only at integer steps, labelled without decimals.
  const stepIncrs = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000,
    10000, 20000, 25000, 50000, 100000, 200000, 500000, 1000000];

  // Exponential moving average with the start-up bias removed (as TensorBoard smooths).
  function smooth(values, weight) {
    if (!weight) return values.slice();
    let last = 0, count = 0;
    return values.map(function (value) {
      if (value === null || !isFinite(value)) return null;
      last = last * weight + (1 - weight) * value;
      count += 1;
      return last / (1 - Math.pow(weight, count));
    });
  }

  function lineChart(element, title, color, readout, data, smoothing) {
    return new uPlot(
      {
        width: plotWidth(element),
        height: 200,
        scales: { x: { time: false }, y: { range: dataRange } },
        legend: { show: false },
        cursor: { drag: { x: true, y: false } },
        series: [
          { label: "step" },
          { label: title + " (raw)", stroke: color, alpha: 0.25, width: 1, spanGaps: true, show: smoothing },
          { label: title, stroke: color, width: 1.5, spanGaps: true },
        ],
        axes: [
          { label: "step", incrs: stepIncrs, values: function (u, ticks) {
            const labels = ticks.map(function (t) { return Number.isInteger(t) ? t.toLocaleString("en-US") : ""; });
            element.dataset.xTicks = labels.join(" ");  // the canvas's labels, for reading back
            return labels;
          } },
          { size: 60, values: function (u, ticks) {
            const labels = ticks.map(function (t) { return axisNumber(t); });
            element.dataset.yTicks = labels.join(" ");
            return labels;
          } },
        ],
        hooks: {
          setCursor: [function (u) {
            const index = u.cursor.idx;
            if (index === null || index === undefined || !u.data[0].length) {
              readout.textContent = "";
              return;
            }
            const raw = u.data[1][index], shown = u.data[2][index];
            let text = "step " + u.data[0][index].toLocaleString("en-US") + ": " + number(raw, 4);
            if (u.series[1].show && shown !== raw) text += " (smoothed " + number(shown, 4) + ")";
            readout.textContent = text;
          }],
        },
      },
      data,
      element
    );
  }

  function axisNumber(value) {
    const size = Math.abs(value);
    if (size !== 0 && (size < 0.001 || size >= 1e6)) return value.toExponential(1);
    return String(Math.round(value * 1e6) / 1e6);
  }

  const training = document.getElementById("training");
  if (training && window.uPlot) {
    const plots = {};
    const latest = {};
    const sections = Array.from(training.querySelectorAll("section.chart"));
    const pollMs = parseInt(training.dataset.pollMs, 10) || 3000;
    const slider = document.getElementById("smoothing");
    const sliderValue = document.getElementById("smoothing-value");
    const fields = {};
    training.querySelectorAll(".card-value[data-field]").forEach(function (element) {
      fields[element.dataset.field] = element;
    });
    let weight = 0;
    try { weight = parseFloat(window.localStorage.getItem("osmosis.smoothing") || "0") || 0; } catch (e) { weight = 0; }
    if (slider) {
      slider.value = String(weight);
      sliderValue.textContent = weight.toFixed(2);
    }
    const series = function (chart) {
      return [chart.steps, chart.values, weight > 0 ? smooth(chart.values, weight) : chart.values];
    };
    const draw = function (key) {
      const chart = latest[key];
      const plot = plots[key];
      if (!chart || !plot) return;
      if (plot.series[1].show !== weight > 0) plot.setSeries(1, { show: weight > 0 });
      plot.setData(series(chart));
    };
    if (slider) {
      slider.addEventListener("input", function () {
        weight = Math.min(0.99, Math.max(0, parseFloat(slider.value) || 0));
        sliderValue.textContent = weight.toFixed(2);
        try { window.localStorage.setItem("osmosis.smoothing", String(weight)); } catch (e) { /* private mode */ }
        Object.keys(plots).forEach(draw);
        training.dataset.smoothing = String(weight);
      });
    }
    const render = function (payload, partial) {
      const byKey = {};
      payload.charts.forEach(function (chart) { byKey[chart.key] = chart; });
      sections.forEach(function (section, index) {
        const chart = byKey[section.dataset.key];
        if (partial && !chart) return;
        const empty = section.querySelector("[data-empty]");
        const count = section.querySelector("[data-count]");
        const plotElement = section.querySelector(".plot");
        if (!chart || !chart.steps.length) {
          empty.hidden = false;
          return;
        }
        empty.hidden = true;
        latest[chart.key] = chart;
        if (!plots[chart.key]) {
          // created with its data, so the first layout already has the data's y-range
          plots[chart.key] = lineChart(plotElement, chart.title, palette[index % palette.length],
            section.querySelector("[data-readout]"), series(chart), weight > 0);
        } else {
          draw(chart.key);
        }
        section.dataset.drawn = "true";
        count.textContent = chart.count.toLocaleString("en-US") + " points" +
          (chart.steps.length < chart.count ? ", " + chart.steps.length + " drawn" : "") +
          "; latest " + number(chart.latest) + "; min " + number(chart.min) + ", max " + number(chart.max);
        if (section.dataset.name === "training_reward") {
          if (fields["overview-reward"]) fields["overview-reward"].textContent = number(chart.latest);
          if (fields["overview-improvement"]) {
            fields["overview-improvement"].textContent =
              (chart.delta > 0 ? "+" : "") + number(chart.delta);
          }
        }
      });
      if (fields["overview-duration"]) fields["overview-duration"].textContent = duration(payload.duration_ms);
      if (fields["overview-samples"]) fields["overview-samples"].textContent = number(payload.processed);
      if (fields["overview-step"]) {
        fields["overview-step"].textContent = number(payload.step) + " / " + number(payload.total_steps);
      }
      setStatus(training.querySelector("h1 [data-field='status']"), payload.status);
      training.dataset.active = payload.active ? "true" : "false";
      if (partial) {
        training.dataset.firstDrawn = "true";
        return;
      }
      training.dataset.loaded = "true";
      if (!payload.active) {
        const note = document.getElementById("charts-note");
        if (note) note.textContent = "";
      }
    };
    const poll = function () {
      getJSON(training.dataset.metricsUrl)
        .then(function (payload) { render(payload, false); })
        .catch(function () { /* kept: the next poll tries again */ })
        .finally(function () {
          if (training.dataset.active === "true") window.setTimeout(poll, pollMs);
        });
    };
    // The first group on its own (a small answer, drawn at once), then every chart.
    const first = training.dataset.firstKeys;
    if (first) {
      getJSON(training.dataset.metricsUrl + "?keys=" + encodeURIComponent(first))
        .then(function (payload) { render(payload, true); })
        .catch(function () { /* the full answer draws it */ })
        .finally(poll);
    } else {
      poll();
    }
    window.addEventListener("resize", function () {
      Object.keys(plots).forEach(function (key) {
        const plot = plots[key];
        plot.setSize({ width: plotWidth(plot.root.parentElement), height: 200 });
      });
    });
  }

  // --- reward histogram ----------------------------------------------------------------------------
  const histogram = document.getElementById("histogram");
  const histogramData = document.getElementById("histogram-data");
  if (histogram && histogramData && window.uPlot) {
    const data = JSON.parse(histogramData.textContent);
    const empty = histogram.parentElement.querySelector("[data-empty]");
    if (data.counts && data.counts.length) {
      empty.hidden = true;
      const centers = data.counts.map(function (_, i) { return (data.edges[i] + data.edges[i + 1]) / 2; });
      new uPlot(
        {
          width: plotWidth(histogram),
          height: 200,
          scales: { x: { time: false, range: [data.edges[0], data.edges[data.edges.length - 1]] } },
          legend: { show: false },
          series: [
            { label: "reward" },
            { label: "samples", fill: "rgba(37,99,235,0.35)", stroke: "#2563eb", points: { show: false }, paths: uPlot.paths.bars({ size: [0.95, 200] }) },
          ],
          axes: [{ label: "reward" }, { label: "samples", size: 50 }],
        },
        [centers, data.counts],
        histogram
      );
      histogram.dataset.loaded = "true";
    }
  }

  // --- logs ------------------------------------------------------------------------------------------
  const logs = document.getElementById("logs");
  if (logs) {
    const lines = document.getElementById("log-lines");
    const follow = document.getElementById("logs-follow");
    let cursor = 0;
    let timer = null;
    const fetchLogs = function () {
      timer = null;
      getJSON(logs.dataset.url + "?after=" + cursor)
        .then(function (page) {
          const atBottom = lines.scrollTop + lines.clientHeight >= lines.scrollHeight - 4;
          page.lines.forEach(function (line) {
            lines.appendChild(document.createTextNode(
              line.time.replace("T", " ").slice(0, 19) + " " + line.level.toUpperCase() +
              " [" + line.step + "] " + line.message + "\n"
            ));
          });
          cursor = page.cursor;
          if (page.lines.length && (follow.checked || atBottom)) lines.scrollTop = lines.scrollHeight;
          logs.dataset.loaded = "true";
          if (page.more) { timer = window.setTimeout(fetchLogs, 0); return; }
          if (follow.checked && page.active) timer = window.setTimeout(fetchLogs, 2000);
        })
        .catch(function () {
          if (follow.checked) timer = window.setTimeout(fetchLogs, 5000);
        });
    };
    follow.addEventListener("change", function () {
      if (follow.checked && timer === null) fetchLogs();
    });
    fetchLogs();
  }

  // --- dataset upload ---------------------------------------------------------------------------------
  const upload = document.getElementById("upload");
  if (upload) {
    const input = document.getElementById("dataset-file");
    const button = document.getElementById("dataset-upload");
    const status = document.getElementById("upload-status");
    const progress = document.getElementById("upload-progress");
    const samePath = function (url) {
      const parsed = new URL(url, window.location.href);
      return parsed.pathname + parsed.search;  // this server, whatever address it names itself by
    };
    const put = function (url, body, headers) {
      return fetch(samePath(url), { method: "PUT", body: body, headers: headers || {} }).then(function (answer) {
        if (!answer.ok) {
          return answer.text().then(function (text) {
            let message = "upload answered " + answer.status;
            try { message = JSON.parse(text).message || message; } catch (e) { /* not JSON */ }
            throw new Error(message);
          });
        }
        return answer;
      });
    };
    button.addEventListener("click", function () {
      const file = input.files && input.files[0];
      if (!file) { status.textContent = "Choose a file first."; return; }
      button.disabled = true;
      progress.hidden = false;
      progress.value = 0;
      status.textContent = "Uploading " + file.name + "…";
      let datasetId = null;
      postJSON(upload.dataset.startUrl, { file_name: file.name, file_size: file.size })
        .then(function (created) {
          datasetId = created.id;
          const plan = created.upload;
          if (plan.method === "simple") {
            return put(plan.presigned_url, file, plan.upload_headers).then(function () {
              progress.value = 1;
              return null;
            });
          }
          const parts = [];
          let chain = Promise.resolve();
          plan.presigned_urls.forEach(function (part, index) {
            chain = chain.then(function () {
              const start = (part.part_number - 1) * plan.part_size;
              return put(part.presigned_url, file.slice(start, start + part.size)).then(function (answer) {
                parts.push({ PartNumber: part.part_number, ETag: answer.headers.get("ETag") || "" });
                progress.value = (index + 1) / plan.presigned_urls.length;
              });
            });
          });
          return chain.then(function () { return parts; });
        })
        .then(function (parts) {
          const body = parts ? { parts: parts } : {};
          return postJSON(upload.dataset.base + "/" + encodeURIComponent(datasetId) + "/complete", body);
        })
        .then(function (done) {
          status.textContent = "Uploaded: " + done.status + ".";
          upload.dataset.done = "true";
          window.location.assign(upload.dataset.base + "/" + encodeURIComponent(done.id));
        })
        .catch(function (error) {
          status.textContent = "Upload failed: " + error.message;
          upload.dataset.failed = "true";
          button.disabled = false;
        });
    });
  }

  // --- a dataset still processing: look again shortly -----------------------------------------------
  const dataset = document.getElementById("dataset");
  if (dataset && dataset.dataset.processing === "true") {
    window.setTimeout(function () { window.location.reload(); }, 2000);
  }
})();
