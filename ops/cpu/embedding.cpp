// PLACEHOLDER: replaced by the real kernels.
#include "ops/op.hpp"
namespace fusion {
std::unique_ptr<op> make_token_embedding_op(const attr_map&) { throw op_error("op 'token_embedding' not implemented yet"); }
std::unique_ptr<op> make_position_embedding_op(const attr_map&) { throw op_error("op 'position_embedding' not implemented yet"); }
}  // namespace fusion
