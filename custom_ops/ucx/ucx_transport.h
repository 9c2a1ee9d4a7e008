// The wire transport: runs a rank's schedule over UCX (see transport.h).
//
// It owns a UCP worker and an endpoint to every peer. A job may run out of
// place: it then reads `input` wherever the plan has not yet written the
// output (a first receive-and-add writes input + received), so the input is
// never copied as a whole. Each step is cut into segments of at most
// `segment_bytes`, all posted at once, and a received segment is reduced as
// soon as it arrives when nothing else in the round touches its range
// (transfer and reduction overlap).
//
// Progress: inside a job the calling thread polls the UCP worker for up to
// `spin_us` microseconds without an event, then arms the worker and sleeps on
// its event descriptor, so a late peer never costs a core. A peer that sends
// nothing for `timeout_seconds` fails the job, naming it.
#ifndef TFDIST_CUSTOM_OPS_UCX_UCX_TRANSPORT_H_
#define TFDIST_CUSTOM_OPS_UCX_UCX_TRANSPORT_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ucx/abort.h"
#include "ucx/transport.h"

namespace tfdist_ucx {

class Written;  // written.h

class UcxTransport : public Transport {
 public:
  // Creates the UCP worker; see `init_status`. `Connect` must follow before
  // `AllReduce`. `timeout_seconds` <= 0: wait forever.
  UcxTransport(int rank, int world_size, double timeout_seconds, int64_t segment_bytes,
               int spin_us);
  // Closes the endpoints, unless a job failed: UCX may then still reference
  // retired buffers, and the worker is leaked.
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  const Status& init_status() const { return init_status_; }
  // This rank's UCP address, to publish to the peers.
  const std::string& address() const { return address_; }
  // Creates an endpoint to every peer from their addresses (index = rank).
  // Not concurrently with `AllReduce`.
  Status Connect(const std::vector<std::string>& addresses);
  Status AllReduce(const Job& job, std::shared_ptr<void>* result) override;

 private:
  struct Pending;
  Status Run(const Job& job, uint32_t seq);
  Status RunRound(const Job& job, uint32_t seq, int round_index, Written* written);
  Status Wait(std::vector<Pending>& pending, const int& outstanding, const Job& job,
              int round_index);

  static void OnSend(void* request, ucs_status_t status, void* user_data);
  static void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                     void* user_data);

  const int rank_, world_size_;
  const double timeout_seconds_;
  const int64_t segment_bytes_;
  const int spin_us_;
  const uint64_t born_ = AbortCount();  // aborts made later fail this transport
  Status init_status_, failed_;
  std::string address_;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::vector<ucp_ep_h> endpoints_;
  Pending* bad_ = nullptr;  // a message of the current round that failed
  std::vector<char> scratch_;
  uint32_t next_seq_ = 0;
};

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_UCX_TRANSPORT_H_
