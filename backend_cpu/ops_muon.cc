// CPU ops of Muon (docs/math.md, "Muon"): MUON_MOMENTUM, MUON_ORTHOGONALIZE and UPDATE_MUON.
#include "backend_cpu/cpu_ops.h"

namespace renaissance {
namespace cpu {

void run_MUON_MOMENTUM(const CpuContext&, const GraphNode&) {
  throw Error(ErrorKind::kBackend, "MUON_MOMENTUM: not implemented yet on the CPU backend");
}
void run_MUON_ORTHOGONALIZE(const CpuContext&, const GraphNode&) {
  throw Error(ErrorKind::kBackend, "MUON_ORTHOGONALIZE: not implemented yet on the CPU backend");
}
void run_UPDATE_MUON(const CpuContext&, const GraphNode&) {
  throw Error(ErrorKind::kBackend, "UPDATE_MUON: not implemented yet on the CPU backend");
}

}  // namespace cpu
}  // namespace renaissance
