// Unmatched point-to-point messages over UCX: the parameter servers' transport.
//
// Collectives (comm.h) need every rank to run the same schedule; a parameter
// server instead answers whichever worker speaks. A `Mailbox` owns a UCP
// worker and one thread that runs its calls in submission order:
//
// * a server mailbox listens on a TCP port (UCX's sockaddr connection
//   manager); on accepting a connection it sends the new endpoint its peer
//   id (a message of kind `kAssignKind` whose tag value is the id);
// * a client mailbox connects to a server by "host:port" and waits for that
//   id, which it then puts in the tags of what it sends, so that the server
//   knows whom to answer.
//
// Tags are the caller's 64-bit values (tfdist_ext/ps/wire.py packs
// kind:8 | source:16 | value:40); a receive takes a tag and a mask, matches
// any peer, accepts any length (probe, then receive) and returns the whole tag.
//
// Waiting polls the worker for `spin_us`, then sleeps on its event descriptor,
// so an idle server costs no core. Endpoints use peer error handling: when a
// peer's process ends, calls that wait for it fail at once, naming it; with
// `timeout_seconds` > 0 a call that sees nothing for that long fails too.
// Destroying a mailbox first finishes the calls already submitted.
#ifndef TFDIST_CUSTOM_OPS_UCX_MAILBOX_H_
#define TFDIST_CUSTOM_OPS_UCX_MAILBOX_H_

#include <ucp/api/ucp.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ucx/status.h"

namespace tfdist_ucx {

constexpr uint64_t kAssignKind = 127;  // kind (top 8 bits) of the "your peer id" message

struct MailboxOptions {
  double timeout_seconds = 0.0;  // <= 0: wait forever
  int spin_us = 100;
  int listen_port = -1;          // >= 0: accept connections on this port (0 = any)
  int64_t source = 0;            // the source field of the tags this server sends
};

class Mailbox {
 public:
  explicit Mailbox(MailboxOptions options);
  ~Mailbox();
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  const Status& init_status() const { return init_status_; }
  int port() const { return port_; }  // the port listened on (-1 for a client)

  // Runs `call` on the mailbox thread after the calls before it.
  void Submit(std::function<void()> call);

  // The calls below run on the mailbox thread only (through Submit).

  // Connects to the server at "host:port" whose tags carry `source`, retrying
  // for `connect_seconds` while it does not answer; sets `peer` (this
  // mailbox's index for it) and `id` (the server's id for this mailbox).
  Status Connect(const std::string& address, int64_t source, double connect_seconds,
                 int* peer, int64_t* id);
  // Sends `size` bytes to `peer` under `tag` and waits until they left.
  Status Send(int peer, uint64_t tag, const void* data, size_t size);
  // Posts sends to several peers, then waits for all of them.
  Status SendAll(const std::vector<int>& peers, const std::vector<uint64_t>& tags,
                 const std::vector<const void*>& data, const std::vector<size_t>& sizes);
  // Receives the first message whose tag matches `tag` under `mask`.
  // `watch`: the peer the message must come from (its failure fails the
  // call), or -1 to fail when any open peer fails.
  Status Recv(uint64_t tag, uint64_t mask, int watch, uint64_t* sender_tag,
              std::string* payload);
  // Closes the endpoint of `peer` (its later failure is no longer an error).
  void Close(int peer);

 private:
  struct Request;
  struct Peer;
  void Loop();
  Status WaitFor(const std::function<bool()>& done, int watch, const char* what);
  Status PeerProblem(int watch) const;
  void AcceptPending();
  std::string Describe(int peer) const;
  static void OnConnection(ucp_conn_request_h request, void* arg);
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);

  const MailboxOptions options_;
  Status init_status_;
  int port_ = -1;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int event_fd_ = -1;
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<ucp_conn_request_h> incoming_;  // accepted by the next AcceptPending

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

int64_t RegisterMailbox(std::shared_ptr<Mailbox> mailbox);
std::shared_ptr<Mailbox> LookupMailbox(int64_t handle);
void UnregisterMailbox(int64_t handle);

}  // namespace tfdist_ucx

#endif  // TFDIST_CUSTOM_OPS_UCX_MAILBOX_H_
