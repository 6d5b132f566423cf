// A snapshot holder (actors/snapshot_holder.hpp) around core/snapshot_store.hpp.
#include "actors/snapshot_holder.hpp"

#include <optional>
#include <utility>

#include "actors/errors.hpp"
#include "core/log.hpp"
#include "core/snapshot_store.hpp"

namespace fusion {

namespace {

struct holder_state {
  std::string who, op_name;
  std::optional<snapshot_store> store;
  edge_sender_actor forward;
  snapshot_holder buddy;
  static inline const char* name = "snapshot_holder";
};

using holder_ptr = snapshot_holder::stateful_pointer<holder_state>;

void complain(holder_ptr self, const std::string& what) {
  log_warn(self->state.who, "snapshot of op '" + self->state.op_name + "': " + what);
}

snapshot_holder::behavior_type holder_fn(holder_ptr self, std::string who, std::string op_name, uint32_t tensors,
                                         uint32_t keep, edge_sender_actor forward, snapshot_holder buddy) {
  auto& st = self->state;
  st.who = std::move(who);
  st.op_name = std::move(op_name);
  st.store.emplace(tensors, keep);
  st.forward = std::move(forward);
  st.buddy = std::move(buddy);
  return {
      [=](forward_atom, uint64_t step, uint32_t index, uint32_t slot, uint8_t mode, tensor& t) {
        auto& s = self->state;
        if (mode != static_cast<uint8_t>(pass_mode::state))
          return complain(self, "a tensor that is no state tensor arrived (pass mode " + std::to_string(mode) +
                                    ") and was dropped");
        // The buddy's copy leaves first: the local copy costs the op nothing more (the holder
        // runs beside it), the remote one overlaps the next step's compute.
        if (s.forward) self->send(s.forward, forward_atom::value, step, index, slot, mode, t);
        auto whole = s.store->add(step, index, std::move(t));
        if (!whole) return complain(self, whole.error());
        if (!*whole || !s.forward) return;
        // The sender's side: what the op handed over is the reference the buddy checks against.
        auto sum = s.store->checksum_of(step);
        if (!sum) return;
        if (auto sealed = s.store->seal(step, *sum); !sealed) return complain(self, sealed.error());
        if (s.buddy) self->send(s.buddy, seal_atom::value, step, *sum);
      },
      [=](backward_atom, uint64_t, uint32_t, uint32_t, tensor&) {
        complain(self, "a gradient arrived at its snapshot holder and was dropped");
      },
      [=](reduce_atom, uint64_t, uint32_t, tensor&) {
        complain(self, "a gradient ring message arrived at its snapshot holder and was dropped");
      },
      [=](seal_atom, uint64_t step, uint64_t checksum) {
        if (auto sealed = self->state.store->seal(step, checksum); !sealed) complain(self, sealed.error());
      },
      [=](held_atom) { return self->state.store->complete_steps(); },
      [=](fetch_atom, uint64_t step) -> caf::result<std::vector<tensor>> {
        auto got = self->state.store->get(step);
        if (!got)
          return make_error(fusion_errc::bad_state, self->state.who + " holds no complete snapshot of step " +
                                                        std::to_string(step) + " of op '" + self->state.op_name + "'");
        return std::move(*got);
      },
      [=](stop_atom) { self->quit(); },
  };
}

}  // namespace

snapshot_holder spawn_snapshot_holder(caf::actor_system& sys, std::string who, std::string op_name, uint32_t tensors,
                                      uint32_t keep, edge_sender_actor forward, snapshot_holder buddy) {
  return sys.spawn(holder_fn, std::move(who), std::move(op_name), tensors, keep, std::move(forward), std::move(buddy));
}

}  // namespace fusion
