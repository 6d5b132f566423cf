// The metrics file's step, eval and compression records (layout in metrics_record.hpp), built
// with nlohmann::ordered_json so names are escaped and keys keep their order.
// Shape legend: none.
#include "core/metrics_record.hpp"

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include <nlohmann/json.hpp>

#include "core/graph.hpp"

namespace fusion {

namespace {

using json = nlohmann::ordered_json;

// Invalid UTF-8 in a name becomes U+FFFD instead of an exception: a record is never lost to it.
std::string dump_leaf(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// nlohmann's dump() puts no blanks between items; the metrics file has always had ", " and ": ",
// and scripts and tests grep for them ('"type": "step", "step": 3'). Strings and numbers are
// still written by nlohmann (escaped; the shortest text that reads back as the same double).
void write_spaced(const json& j, std::string& out) {
  if (j.is_object()) {
    out += '{';
    const char* sep = "";
    for (const auto& item : j.items()) {
      out += sep;
      out += dump_leaf(json(item.key()));
      out += ": ";
      write_spaced(item.value(), out);
      sep = ", ";
    }
    out += '}';
  } else if (j.is_array()) {
    out += '[';
    const char* sep = "";
    for (const auto& v : j) {
      out += sep;
      write_spaced(v, out);
      sep = ", ";
    }
    out += ']';
  } else {
    out += dump_leaf(j);
  }
}

std::string line_of(const json& j) {
  std::string out;
  write_spaced(j, out);
  return out;
}

// `v` as printf's `format` writes it, read back: numbers keep the precision the records have
// always had (a loss to 6 decimals, op times to the microsecond), so the values stay those of
// older files and a large model's per-op lists do not triple in length with digits nobody
// measured. NaN and infinity stay what they are (nlohmann writes them as null).
double printed(double v, const char* format) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return std::strtod(buf, nullptr);
}

json milliseconds(const std::vector<double>& seconds) {
  json out = json::array();
  for (double s : seconds) out.push_back(printed(s * 1e3, "%.3f"));
  return out;
}

}  // namespace

std::string metrics_time(std::chrono::system_clock::time_point t) {
  const auto since_epoch = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  // Floor division: a time before 1970 still gets milliseconds in 0..999.
  long long ms = since_epoch % 1000;
  if (ms < 0) ms += 1000;
  const std::time_t secs = static_cast<std::time_t>((since_epoch - ms) / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

std::string step_metrics_line(const step_record& rec, const graph& g, double elapsed_s, const std::string& time) {
  json ops = json::object();
  for (const auto& m : rec.ops) {
    json op = {{"fwd_ms", milliseconds(m.forward_s)}, {"bwd_ms", milliseconds(m.backward_s)}};
    if (m.peak_live > 0) op["live"] = m.peak_live;
    if (!m.reduce_s.empty()) {
      op["reduce_ms"] = milliseconds(m.reduce_s);
      op["reduce_work_ms"] = milliseconds(m.reduce_work_s);
      op["reduce_bytes"] = m.reduce_bytes;
    }
    ops[g.nodes[m.node].name] = std::move(op);
  }
  json edges = json::array();
  for (const auto& e : rec.edges)
    edges.push_back({{"from", e.from_node},
                     {"to", e.to_node},
                     {"edge", g.nodes[e.producer].name + "->" + g.nodes[e.consumer].name},
                     {"dir", e.forward ? "fwd" : "bwd"},
                     {"bytes", e.bytes},
                     {"dense_bytes", e.dense_bytes},
                     {"tensors", e.tensors},
                     {"seconds", printed(e.seconds, "%.6f")},
                     {"encode_s", printed(e.encode_s, "%.6f")},
                     {"keep_ratio", printed(e.keep_ratio, "%.4g")},
                     {"idle_starts", e.idle_starts}});
  json line = {{"type", "step"},
               {"step", rec.step},
               {"loss", printed(rec.loss, "%.6f")},
               {"lr", printed(rec.lr, "%.6g")},
               {"grad_norm", printed(rec.grad_norm, "%.6f")},
               {"tokens_per_s", printed(rec.tokens_per_s, "%.1f")},
               {"step_s", printed(rec.step_s, "%.4f")},
               {"predicted_step_s", printed(rec.predicted_step_s, "%.4f")},
               {"boundary_s", printed(rec.boundary_s, "%.6f")},
               {"update_s", printed(rec.update_s, "%.6f")}};
  // Only replica runs have an all-reduce: pipeline records keep the layout they always had.
  if (rec.allreduce_bytes > 0) {
    line["allreduce_bytes"] = rec.allreduce_bytes;
    line["allreduce_work_s"] = printed(rec.allreduce_work_s, "%.6f");
    line["allreduce_exposed_s"] = printed(rec.allreduce_exposed_s, "%.6f");
  }
  line["elapsed_s"] = printed(elapsed_s, "%.3f");
  line["time"] = time;
  line["ops"] = std::move(ops);
  line["edges"] = std::move(edges);
  if (!rec.nodes.empty()) {
    json cpu = json::object();
    for (const auto& n : rec.nodes) cpu[n.node] = printed(n.cpu_s, "%.4f");
    line["node_cpu_s"] = std::move(cpu);
  }
  return line_of(line);
}

std::string eval_metrics_line(int64_t step, const eval_result& v, const std::string& time) {
  json rec = {{"type", "eval"}, {"step", step}, {"val_loss", printed(v.loss, "%.6f")}};
  if (!std::isnan(v.accuracy)) rec["val_accuracy"] = printed(v.accuracy, "%.6f");
  if (!std::isnan(v.bits_per_byte)) rec["val_bpb"] = printed(v.bits_per_byte, "%.6f");
  rec["time"] = time;
  return line_of(rec);
}

std::string compression_metrics_line(const compression_change& c) {
  // %.6g: what the record's std::ostream (default precision) used to write.
  return line_of({{"type", "compression"},
                  {"step", c.step},
                  {"link", c.link},
                  {"keep_before", printed(c.keep_before, "%.6g")},
                  {"keep_after", printed(c.keep_after, "%.6g")},
                  {"mbit", printed(c.mbit, "%.6g")},
                  {"dense_bytes", c.dense_bytes},
                  {"budget_s", printed(c.budget_s, "%.6g")},
                  {"codec_before", c.codec_before},
                  {"codec_after", c.codec_after},
                  {"reason", c.reason}});
}

}  // namespace fusion
