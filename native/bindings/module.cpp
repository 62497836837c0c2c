// bear.core._native: the compiled replay core. Private: bear.core.replay is its only user.
#include <pybind11/pybind11.h>

namespace py = pybind11;

void register_replay(py::module_& m);

PYBIND11_MODULE(_native, m) {
  m.doc() = "BEAR's compiled replay core (private; use bear.core.replay)";
  register_replay(m);
}
