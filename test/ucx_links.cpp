// test/ucx_links.cpp — the transports UCX finds here (ucx_links.hpp's
// offered()). Apart from the header so that only this file needs UCX's own
// headers.
#include "test/ucx_links.hpp"

#include <uct/api/uct.h>

#include <set>
#include <string>
#include <vector>

namespace blobpipe::testing {

/// The transports UCX finds on this machine ("tcp", "posix", ...), as
/// ucx_info -d lists them: every memory domain of every UCT component,
/// asked for its transport resources.
const std::set<std::string>& ucx_transports_here() {
  static const std::set<std::string> names = [] {
    std::set<std::string> out;
    uct_component_h* comps = nullptr;
    unsigned ncomps = 0;
    if (uct_query_components(&comps, &ncomps) != UCS_OK) return out;
    for (unsigned c = 0; c < ncomps; ++c) {
      uct_component_attr_t attr{};
      attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
      if (uct_component_query(comps[c], &attr) != UCS_OK) continue;
      std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
      attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
      attr.md_resources = mds.data();
      if (uct_component_query(comps[c], &attr) != UCS_OK) continue;
      for (const auto& md_desc : mds) {
        uct_md_config_t* cfg = nullptr;
        if (uct_md_config_read(comps[c], nullptr, nullptr, &cfg) != UCS_OK) continue;
        uct_md_h md = nullptr;
        const ucs_status_t opened = uct_md_open(comps[c], md_desc.md_name, cfg, &md);
        uct_config_release(cfg);
        if (opened != UCS_OK) continue;
        uct_tl_resource_desc_t* tls = nullptr;
        unsigned ntls = 0;
        if (uct_md_query_tl_resources(md, &tls, &ntls) == UCS_OK) {
          for (unsigned t = 0; t < ntls; ++t) out.insert(tls[t].tl_name);
          uct_release_tl_resource_list(tls);
        }
        uct_md_close(md);
      }
    }
    uct_release_component_list(comps);
    return out;
  }();
  return names;
}

}  // namespace blobpipe::testing
