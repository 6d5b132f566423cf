#include "actors/messages.hpp"

namespace fusion {

void add_fusion_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<tensor>("fusion.tensor");
  cfg.add_message_type<named_tensors>("fusion.named_tensors");
  cfg.add_message_type<std::vector<caf::actor>>("fusion.actor_list");
  cfg.add_message_type<tensor_sink>("fusion.tensor_sink");
  cfg.add_message_type<std::vector<tensor_sink>>("fusion.tensor_sink_list");
  cfg.add_message_type<replica_ring>("fusion.replica_ring");
  cfg.add_message_type<reduce_timing>("fusion.reduce_timing");
  cfg.add_message_type<op_actor>("fusion.op_actor");
  cfg.add_message_type<op_reporter>("fusion.op_reporter");
  cfg.add_message_type<edge_sender_actor>("fusion.edge_sender_actor");
  cfg.add_message_type<node_inbox>("fusion.node_inbox");
  cfg.add_message_type<node_actor>("fusion.node_actor");
  cfg.add_message_type<std::vector<double>>("fusion.f64_list");
  cfg.add_message_type<security::proof>("fusion.proof");
  cfg.add_message_type<node_hello>("fusion.node_hello");
  cfg.add_message_type<wire_chunk>("fusion.wire_chunk");
  cfg.add_message_type<edge_stat>("fusion.edge_stat");
  cfg.add_message_type<node_stats>("fusion.node_stats");
  cfg.add_message_type<node_spec>("fusion.node_spec");
  cfg.add_message_type<actor_run_params>("fusion.actor_run_params");
  cfg.add_message_type<edge_config>("fusion.edge_config");
  cfg.add_message_type<codec_settings>("fusion.codec_settings");
  cfg.add_message_type<std::vector<std::string>>("fusion.string_list");
  cfg.add_message_type<admin_actor>("fusion.admin_actor");
  cfg.add_message_type<op_signature>("fusion.op_signature");
  cfg.add_message_type<std::vector<op_signature>>("fusion.op_signature_list");
  cfg.add_message_type<op_timing>("fusion.op_timing");
  cfg.add_message_type<device_timing>("fusion.device_timing");
  cfg.add_message_type<state_export>("fusion.state_export");
  cfg.add_message_type<snapshot_holder>("fusion.snapshot_holder");
  cfg.add_message_type<std::vector<uint64_t>>("fusion.u64_list");
  cfg.add_message_type<std::vector<tensor>>("fusion.tensor_list");
  add_fusion_error_category(cfg);
}

}  // namespace fusion
