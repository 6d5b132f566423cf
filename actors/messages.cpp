#include "actors/messages.hpp"

namespace fusion {

void add_fusion_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<tensor>("fusion.tensor");
  cfg.add_message_type<named_tensors>("fusion.named_tensors");
  cfg.add_message_type<std::vector<caf::actor>>("fusion.actor_list");
}

}  // namespace fusion
