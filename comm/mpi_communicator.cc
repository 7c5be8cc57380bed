// MpiCommunicator: the Communicator over MPI_COMM_WORLD with Open MPI's collectives. Blocks are
// moved as MPI_BYTE (counts and displacements are int: one call moves less than 2 GiB per rank).
#include "renaissance/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <string>
#include <vector>

#include "mpi_session.h"
#include "renaissance/error.h"

namespace renaissance {

namespace {

int to_int(uint64_t v, const char* what) {
  if (v > static_cast<uint64_t>(INT_MAX)) {
    throw Error(ErrorKind::kBackend, std::string("mpi: ") + what + " of " + std::to_string(v) +
                                         " exceeds what one MPI call takes (2 GiB)");
  }
  return static_cast<int>(v);
}

std::vector<int> to_ints(const std::vector<uint64_t>& v, const char* what) {
  std::vector<int> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_int(v[i], what);
  return out;
}

class MpiCommunicator final : public Communicator {
 public:
  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  std::string describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    const size_t comma = v.find(',');
    return "mpi (" + v.substr(0, comma) + ", " + std::to_string(mpi_.size()) + " ranks)";
  }

  void all_gather_v(void* buffer, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& counts) override {
    const std::vector<int> displs = to_ints(offsets, "an offset"), cnts = to_ints(counts, "a block");
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buffer, cnts.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD);
  }

  void all_to_all_v(const void* send, const std::vector<uint64_t>& send_offsets, const std::vector<uint64_t>& send_counts,
                    void* recv, const std::vector<uint64_t>& recv_offsets,
                    const std::vector<uint64_t>& recv_counts) override {
    const std::vector<int> sd = to_ints(send_offsets, "an offset"), sc = to_ints(send_counts, "a block");
    const std::vector<int> rd = to_ints(recv_offsets, "an offset"), rc = to_ints(recv_counts, "a block");
    MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, MPI_COMM_WORLD);
  }

  void reduce_scatter_sum_f32(const float* send, float* recv, const std::vector<uint64_t>& counts) override {
    const std::vector<int> cnts = to_ints(counts, "a block");
    MPI_Reduce_scatter(send, recv, cnts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }

  void all_reduce_max_i32(int32_t* values, uint64_t count) override {
    MPI_Allreduce(MPI_IN_PLACE, values, to_int(count, "a count"), MPI_INT32_T, MPI_MAX, MPI_COMM_WORLD);
  }

  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

 private:
  MpiSession mpi_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

std::vector<std::string> mpi_all_gather_text(const std::string& text) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) throw Error(ErrorKind::kBackend, "mpi: all-gather of a text without a running MPI");
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // The lengths first, then the texts themselves (one block per rank, in rank order).
  const int length = to_int(text.size(), "a text");
  std::vector<int> lengths(static_cast<size_t>(size)), displs(static_cast<size_t>(size));
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  uint64_t total = 0;
  for (int r = 0; r < size; ++r) {
    displs[static_cast<size_t>(r)] = to_int(total, "the gathered texts");
    total += static_cast<uint64_t>(lengths[static_cast<size_t>(r)]);
  }
  std::vector<char> all(static_cast<size_t>(to_int(total, "the gathered texts")) + 1);
  MPI_Allgatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> texts(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const size_t i = static_cast<size_t>(r);
    texts[i].assign(all.data() + displs[i], static_cast<size_t>(lengths[i]));
  }
  return texts;
}

}  // namespace renaissance
