// UCX mailbox: unmatched tagged messages for the parameter servers (mailbox.h).
#include "ucx/mailbox.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>

#include "ucx/abort.h"
#include "ucx/handles.h"
#include "ucx/worker.h"

namespace tfdist_ucx {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kKindSourceMask = ~((uint64_t{1} << 40) - 1);
constexpr uint64_t kValueMask = (uint64_t{1} << 40) - 1;

auto* mailboxes = new HandleTable<Mailbox>();  // never destroyed (handles.h)

uint64_t AssignTag(int64_t source, uint64_t id) {
  return (kAssignKind << 56) | ((static_cast<uint64_t>(source) & 0xFFFF) << 40) |
         (id & kValueMask);
}

void FreeWhenDone(void* request, ucs_status_t, void*) { ucp_request_free(request); }

Status ResolveAddress(const std::string& address, sockaddr_storage* out, socklen_t* length) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos)
    return Status::Error("expected \"host:port\", got \"" + address + "\"");
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints = {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr)
    return Status::Error("cannot resolve " + address + ": " + gai_strerror(rc));
  std::memcpy(out, found->ai_addr, found->ai_addrlen);
  *length = found->ai_addrlen;
  freeaddrinfo(found);
  return Status::Ok();
}

}  // namespace

struct Mailbox::Request {
  bool done = false;
  ucs_status_t status = UCS_OK;
  uint64_t sender_tag = 0;
};

struct Mailbox::Peer {
  Mailbox* owner;
  int index;
  std::string name;
  ucp_ep_h ep = nullptr;
  bool failed = false, closed = false;
  ucs_status_t status = UCS_OK;
};

Mailbox::Mailbox(MailboxOptions options) : options_(options) {
  init_status_ = CreateWorker(UCS_THREAD_MODE_SINGLE, &worker_, &event_fd_);
  if (!init_status_.ok()) return;
  if (options_.listen_port >= 0) {
    sockaddr_in any = {};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = INADDR_ANY;
    any.sin_port = htons(static_cast<uint16_t>(options_.listen_port));
    ucp_listener_params_t lp = {};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&any);
    lp.sockaddr.addrlen = sizeof(any);
    lp.conn_handler.cb = &Mailbox::OnConnection;
    lp.conn_handler.arg = this;
    ucs_status_t status = ucp_listener_create(worker_, &lp, &listener_);
    if (status != UCS_OK) {
      init_status_ = Status::Error("cannot listen on port " +
                                   std::to_string(options_.listen_port) + ": " +
                                   ucs_status_string(status));
      listener_ = nullptr;
      return;
    }
    ucp_listener_attr_t attr = {};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(listener_, &attr) == UCS_OK)
      port_ = ntohs(reinterpret_cast<sockaddr_in*>(&attr.sockaddr)->sin_port);
  }
  thread_ = std::thread([this] { Loop(); });
}

Mailbox::~Mailbox() {
  if (thread_.joinable()) {  // after the calls already queued
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  for (auto& peer : peers_) {
    if (peer->ep == nullptr) continue;
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* request = ucp_ep_close_nbx(peer->ep, &param);
    if (UCS_PTR_IS_PTR(request)) {
      auto deadline = Clock::now() + std::chrono::seconds(1);
      while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline)
        ucp_worker_progress(worker_);
      ucp_request_free(request);
    }
  }
  if (listener_ != nullptr) ucp_listener_destroy(listener_);
  for (ucp_conn_request_h request : incoming_) ucp_listener_reject(listener_, request);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
}

void Mailbox::Submit(std::function<void()> call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(call));
  }
  cv_.notify_one();
}

void Mailbox::Loop() {
  while (true) {
    std::function<void()> call;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      call = std::move(queue_.front());
      queue_.pop_front();
    }
    call();
  }
}

void Mailbox::OnConnection(ucp_conn_request_h request, void* arg) {
  static_cast<Mailbox*>(arg)->incoming_.push_back(request);
}

void Mailbox::OnError(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  peer->failed = true;
  peer->status = status;
}

void Mailbox::AcceptPending() {
  while (!incoming_.empty()) {
    ucp_conn_request_h request = incoming_.front();
    incoming_.erase(incoming_.begin());
    auto peer = std::make_unique<Peer>();
    peer->owner = this;
    peer->index = static_cast<int>(peers_.size());
    peer->name = "peer " + std::to_string(peer->index);
    ucp_ep_params_t params = {};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Mailbox::OnError;
    params.err_handler.arg = peer.get();
    if (ucp_ep_create(worker_, &params, &peer->ep) != UCS_OK) continue;
    // The id travels in the tag; the payload is empty.
    ucp_request_param_t send = {};
    send.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    send.cb.send = &FreeWhenDone;
    void* sent = ucp_tag_send_nbx(peer->ep, nullptr, 0,
                                  AssignTag(options_.source, peer->index), &send);
    (void)sent;  // freed by its callback, or already complete (or failed: seen later)
    peers_.push_back(std::move(peer));
  }
}

std::string Mailbox::Describe(int peer) const {
  return peers_[peer]->name + " failed: " + ucs_status_string(peers_[peer]->status) +
         " (its process ended or the connection broke)";
}

Status Mailbox::PeerProblem(int watch) const {
  if (watch >= 0)
    return peers_[watch]->failed && !peers_[watch]->closed ? Status::Error(Describe(watch))
                                                           : Status::Ok();
  for (const auto& peer : peers_)
    if (peer->failed && !peer->closed) return Status::Error(Describe(peer->index));
  return Status::Ok();
}

Status Mailbox::WaitFor(const std::function<bool()>& done, int watch, const char* what) {
  const auto spin = std::chrono::microseconds(options_.spin_us);
  const auto timeout = std::chrono::duration<double>(options_.timeout_seconds);
  auto start = Clock::now(), last_event = start;
  while (!done()) {
    unsigned events = ucp_worker_progress(worker_);
    AcceptPending();
    if (done()) break;
    TFDIST_UCX_RETURN_IF_ERROR(PeerProblem(watch));
    std::string reason;
    if (Aborted(&reason)) return Status::Error(reason);
    auto now = Clock::now();
    if (events != 0) {
      last_event = now;
      continue;
    }
    if (now - last_event < spin) continue;
    if (options_.timeout_seconds > 0 && now - start > timeout)
      return Status::Error(std::string("nothing happened for ") +
                           std::to_string(options_.timeout_seconds) + " s while " + what);
    WaitForEvent(worker_, event_fd_, 10);  // listener events may not wake the descriptor
  }
  return Status::Ok();
}

Status Mailbox::Connect(const std::string& address, int64_t source, double connect_seconds,
                        int* peer_index, int64_t* id) {
  TFDIST_UCX_RETURN_IF_ERROR(init_status_);
  sockaddr_storage storage;
  socklen_t length;
  TFDIST_UCX_RETURN_IF_ERROR(ResolveAddress(address, &storage, &length));
  auto deadline = Clock::now() + std::chrono::duration<double>(connect_seconds);
  while (true) {  // the server may not listen yet: retry until the deadline
    auto peer = std::make_unique<Peer>();
    peer->owner = this;
    peer->index = static_cast<int>(peers_.size());
    peer->name = "the parameter server at " + address;
    ucp_ep_params_t params = {};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&storage);
    params.sockaddr.addrlen = length;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Mailbox::OnError;
    params.err_handler.arg = peer.get();
    ucs_status_t status = ucp_ep_create(worker_, &params, &peer->ep);
    if (status != UCS_OK)
      return Status::Error("ucp_ep_create to " + address + ": " + ucs_status_string(status));
    peers_.push_back(std::move(peer));
    *peer_index = static_cast<int>(peers_.size()) - 1;
    uint64_t tag;
    std::string ignored;
    Status received = Recv(AssignTag(source, 0), kKindSourceMask, *peer_index, &tag, &ignored);
    if (received.ok()) {
      *id = static_cast<int64_t>(tag & kValueMask);
      return Status::Ok();
    }
    Peer& failed = *peers_[*peer_index];
    if (!failed.failed) return Status::Error("connecting to " + address + ": " +
                                             received.message());
    if (Clock::now() > deadline)
      return Status::Error("no parameter server answered at " + address + " within " +
                           std::to_string(static_cast<int>(connect_seconds)) +
                           " s (last attempt: " + ucs_status_string(failed.status) + ")");
    failed.closed = true;  // a refused attempt; its endpoint is released at exit
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Status Mailbox::SendAll(const std::vector<int>& peers, const std::vector<uint64_t>& tags,
                        const std::vector<const void*>& data, const std::vector<size_t>& sizes) {
  std::vector<Request> requests(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    if (peers[i] < 0 || peers[i] >= static_cast<int>(peers_.size()))
      return Status::Error("no peer " + std::to_string(peers[i]));
    TFDIST_UCX_RETURN_IF_ERROR(PeerProblem(peers[i]));
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = [](void* request, ucs_status_t status, void* user) {
      auto* r = static_cast<Request*>(user);
      r->done = true;
      r->status = status;
      ucp_request_free(request);
    };
    param.user_data = &requests[i];
    void* request = ucp_tag_send_nbx(peers_[peers[i]]->ep, data[i], sizes[i], tags[i], &param);
    if (UCS_PTR_IS_ERR(request)) {
      requests[i].done = true;
      requests[i].status = UCS_PTR_STATUS(request);
    } else if (request == nullptr) {
      requests[i].done = true;
    }
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    const Request& r = requests[i];
    // A failed peer completes its sends with an error.
    TFDIST_UCX_RETURN_IF_ERROR(WaitFor([&r] { return r.done; }, peers[i], "sending"));
    if (r.status != UCS_OK)
      return Status::Error("sending to " + peers_[peers[i]]->name + " failed: " +
                           ucs_status_string(r.status));
  }
  return Status::Ok();
}

Status Mailbox::Send(int peer, uint64_t tag, const void* data, size_t size) {
  return SendAll({peer}, {tag}, {data}, {size});
}

Status Mailbox::Recv(uint64_t tag, uint64_t mask, int watch, uint64_t* sender_tag,
                     std::string* payload) {
  ucp_tag_recv_info_t info = {};
  ucp_tag_message_h message = nullptr;
  TFDIST_UCX_RETURN_IF_ERROR(WaitFor(
      [&] {
        message = ucp_tag_probe_nb(worker_, tag, mask, 1, &info);
        return message != nullptr;
      },
      watch, "waiting for a message"));
  payload->resize(info.length);
  Request r;
  ucp_request_param_t param = {};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv = [](void* request, ucs_status_t status, const ucp_tag_recv_info_t*,
                     void* user) {
    auto* req = static_cast<Request*>(user);
    req->done = true;
    req->status = status;
    ucp_request_free(request);
  };
  param.user_data = &r;
  void* request = ucp_tag_msg_recv_nbx(worker_, payload->data(), info.length, message, &param);
  if (UCS_PTR_IS_ERR(request))
    return Status::Error(std::string("receive: ") + ucs_status_string(UCS_PTR_STATUS(request)));
  if (request == nullptr) r.done = true;
  TFDIST_UCX_RETURN_IF_ERROR(WaitFor([&r] { return r.done; }, watch, "receiving a message"));
  if (r.status != UCS_OK)
    return Status::Error(std::string("receive: ") + ucs_status_string(r.status));
  *sender_tag = info.sender_tag;
  return Status::Ok();
}

void Mailbox::Close(int peer) {
  if (peer >= 0 && peer < static_cast<int>(peers_.size())) peers_[peer]->closed = true;
}

int64_t RegisterMailbox(std::shared_ptr<Mailbox> mailbox) {
  return mailboxes->Add(std::move(mailbox));
}
std::shared_ptr<Mailbox> LookupMailbox(int64_t handle) { return mailboxes->Find(handle); }
void UnregisterMailbox(int64_t handle) { mailboxes->Remove(handle); }

}  // namespace tfdist_ucx
