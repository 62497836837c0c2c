// Binding of the replay core: converts types and releases the GIL, nothing more.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <vector>

#include "bear/replay.hpp"

namespace py = pybind11;

namespace {

using Int64Table = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;

// Column order of a resident table: one row per request.
constexpr py::ssize_t kResidentColumns = 10;

std::vector<bear::Resident> residents_from(const Int64Table& table) {
  if (table.ndim() != 2 || table.shape(1) != kResidentColumns) {
    throw std::invalid_argument("resident table must have shape (n, 10)");
  }
  std::vector<bear::Resident> residents(static_cast<size_t>(table.shape(0)));
  auto rows = table.unchecked<2>();
  for (py::ssize_t i = 0; i < table.shape(0); ++i) {
    bear::Resident& r = residents[static_cast<size_t>(i)];
    r.num_prompt_tokens = rows(i, 0);
    r.num_computed_tokens = rows(i, 1);
    r.num_output_tokens = rows(i, 2);
    r.remaining_output_tokens = rows(i, 3);
    r.num_allocated_blocks = rows(i, 4);
    r.max_tokens = rows(i, 5);
    r.num_output_placeholders = rows(i, 6);
    r.cached_tokens = rows(i, 7);
    r.num_evictable_blocks = rows(i, 8);
    r.num_free_blocks_ahead = rows(i, 9);
  }
  return residents;
}

bear::PreparedState make_state(const bear::EngineConfig& engine, int64_t free_blocks, const Int64Table& running,
                               const Int64Table& waiting, int64_t shared_blocks) {
  bear::InstanceState state;
  state.engine = engine;
  state.free_blocks = free_blocks;
  state.shared_blocks = shared_blocks;
  state.running = residents_from(running);
  state.waiting = residents_from(waiting);
  return bear::prepare(state);
}

using DoubleArray = py::array_t<double, py::array::c_style | py::array::forcecast>;

std::vector<bear::Arrival> arrivals_from(const DoubleArray& times, const Int64Table& requests) {
  std::vector<bear::Resident> residents = residents_from(requests);
  if (times.ndim() != 1 || static_cast<size_t>(times.shape(0)) != residents.size()) {
    throw std::invalid_argument("one arrival time per arriving request");
  }
  std::vector<bear::Arrival> arrivals(residents.size());
  auto at = times.unchecked<1>();
  for (size_t i = 0; i < residents.size(); ++i) arrivals[i] = bear::Arrival{at(static_cast<py::ssize_t>(i)), residents[i]};
  return arrivals;
}

bear::Result replay_one(const bear::PreparedState& state, const bear::Query& query,
                        const bear::BatchTimeCoefficients& coefficients, double horizon_s, bool record_batches,
                        bool shortcuts, int64_t max_steps, double query_time_s, double in_flight_s,
                        const std::vector<bear::Arrival>& arrivals) {
  bear::Options options;
  options.horizon_s = horizon_s;
  options.record_batches = record_batches;
  options.shortcuts = shortcuts;
  options.max_steps = max_steps;
  options.query_time_s = query_time_s;
  options.in_flight_s = in_flight_s;
  return bear::replay(state, query, coefficients, options, arrivals);
}

// One estimate per instance: (state, coefficients, query time, in-flight time, arrivals, the query's cached prompt
// tokens there) each.
struct Candidate {
  const bear::PreparedState* state;
  bear::BatchTimeCoefficients coefficients;
  double query_time_s;
  double in_flight_s;
  std::vector<bear::Arrival> arrivals;
  int64_t query_cached_tokens;
};

std::vector<bear::Result> replay_each(const std::vector<Candidate>& candidates, const bear::Query& query,
                                      double horizon_s) {
  std::vector<bear::Result> results;
  results.reserve(candidates.size());
  for (const Candidate& c : candidates) {
    bear::Query here = query;
    here.cached_tokens = c.query_cached_tokens;
    results.push_back(replay_one(*c.state, here, c.coefficients, horizon_s, false, true, bear::Options{}.max_steps,
                                 c.query_time_s, c.in_flight_s, c.arrivals));
  }
  return results;
}

}  // namespace

void register_replay(py::module_& m) {
  py::class_<bear::EngineConfig>(m, "EngineConfig")
      .def(py::init<>())
      .def_readwrite("max_num_batched_tokens", &bear::EngineConfig::max_num_batched_tokens)
      .def_readwrite("max_num_seqs", &bear::EngineConfig::max_num_seqs)
      .def_readwrite("block_size", &bear::EngineConfig::block_size)
      .def_readwrite("num_gpu_blocks", &bear::EngineConfig::num_gpu_blocks)
      .def_readwrite("enable_chunked_prefill", &bear::EngineConfig::enable_chunked_prefill)
      .def_readwrite("long_prefill_token_threshold", &bear::EngineConfig::long_prefill_token_threshold)
      .def_readwrite("max_model_len", &bear::EngineConfig::max_model_len)
      .def_readwrite("scheduler_reserve_full_isl", &bear::EngineConfig::scheduler_reserve_full_isl)
      .def_readwrite("watermark", &bear::EngineConfig::watermark)
      .def_readwrite("async_scheduling", &bear::EngineConfig::async_scheduling)
      .def_readwrite("enable_prefix_caching", &bear::EngineConfig::enable_prefix_caching);

  py::class_<bear::PreparedState>(m, "PreparedState")
      .def(py::init(&make_state), py::arg("engine"), py::arg("free_blocks"), py::arg("running"), py::arg("waiting"),
           py::arg("shared_blocks") = 0)
      .def_property_readonly("num_requests", [](const bear::PreparedState& s) { return s.requests.size(); });

  py::class_<bear::Query>(m, "Query")
      .def(py::init([](int64_t prompt, int64_t output, int64_t cached) { return bear::Query{prompt, output, cached}; }),
           py::arg("num_prompt_tokens"), py::arg("output_tokens"), py::arg("cached_tokens") = 0);

  py::class_<bear::BatchTimeCoefficients>(m, "BatchTimeCoefficients")
      .def(py::init([](double b0, double b1, double b2, double b3) { return bear::BatchTimeCoefficients{b0, b1, b2, b3}; }),
           py::arg("b0"), py::arg("b1"), py::arg("b2"), py::arg("b3"));

  py::enum_<bear::Status>(m, "Status")
      .value("FIRST_TOKEN", bear::Status::kFirstToken)
      .value("EXCEEDS_HORIZON", bear::Status::kExceedsHorizon)
      .value("INFEASIBLE", bear::Status::kInfeasible);
  py::enum_<bear::Infeasibility>(m, "Infeasibility")
      .value("NONE", bear::Infeasibility::kNone)
      .value("PROMPT_TOO_LONG", bear::Infeasibility::kPromptTooLong)
      .value("PROMPT_EXCEEDS_CACHE", bear::Infeasibility::kPromptExceedsCache)
      .value("STUCK", bear::Infeasibility::kStuck)
      .value("STEP_LIMIT", bear::Infeasibility::kStepLimit);

  py::class_<bear::Batch>(m, "Batch")
      .def_readonly("scheduled", &bear::Batch::scheduled)
      .def_readonly("num_prefill_tokens", &bear::Batch::num_prefill_tokens)
      .def_readonly("num_decode_tokens", &bear::Batch::num_decode_tokens)
      .def_readonly("decode_context", &bear::Batch::decode_context)
      .def_readonly("prefill_attention", &bear::Batch::prefill_attention)
      .def_readonly("time_s", &bear::Batch::time_s);

  py::class_<bear::Result>(m, "Result")
      .def_readonly("status", &bear::Result::status)
      .def_readonly("infeasibility", &bear::Result::infeasibility)
      .def_readonly("blocking_request", &bear::Result::blocking_request)
      .def_readonly("first_token_batch", &bear::Result::first_token_batch)
      .def_readonly("num_batches", &bear::Result::num_batches)
      .def_readonly("num_steps", &bear::Result::num_steps)
      .def_readonly("num_preemptions", &bear::Result::num_preemptions)
      .def_readonly("time_s", &bear::Result::time_s)
      .def_readonly("batches", &bear::Result::batches)
      .def("summary",
           [](const bear::Result& r) {
             return py::make_tuple(static_cast<int>(r.status), static_cast<int>(r.infeasibility), r.blocking_request,
                                   r.first_token_batch, r.num_batches, r.num_steps, r.num_preemptions, r.time_s);
           },
           "(status, infeasibility, blocking_request, first_token_batch, num_batches, num_steps, num_preemptions, "
           "time_s), in one conversion");

  py::class_<bear::Arrival>(m, "Arrivals");  // opaque: built by `arrivals`
  m.def("arrivals", &arrivals_from, py::arg("times"), py::arg("requests"),
        "Arrivals from their times (shape (n,)) and a resident table (shape (n, 8))");
  py::class_<Candidate>(m, "Candidate")
      .def(py::init([](const bear::PreparedState& state, const bear::BatchTimeCoefficients& coefficients,
                       double query_time_s, double in_flight_s, std::vector<bear::Arrival> arrivals,
                       int64_t query_cached_tokens) {
             return Candidate{&state, coefficients, query_time_s, in_flight_s, std::move(arrivals),
                              query_cached_tokens};
           }),
           py::arg("state"), py::arg("coefficients"), py::arg("query_time_s"), py::arg("in_flight_s"),
           py::arg("arrivals"), py::arg("query_cached_tokens") = 0, py::keep_alive<1, 2>());

  m.def("replay", &replay_one, py::arg("state"), py::arg("query"), py::arg("coefficients"), py::arg("horizon_s"),
        py::arg("record_batches"), py::arg("shortcuts"), py::arg("max_steps"), py::arg("query_time_s"),
        py::arg("in_flight_s"), py::arg("arrivals"), py::call_guard<py::gil_scoped_release>());
  m.def("replay_each", &replay_each, py::arg("candidates"), py::arg("query"), py::arg("horizon_s"),
        py::call_guard<py::gil_scoped_release>());
}
