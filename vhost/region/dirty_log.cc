#include "vhost/region/dirty_log.h"

namespace vsocket::vhost {

const DirtyLog& DirtyLog::Never() {
  static const DirtyLog never;
  return never;
}

}  // namespace vsocket::vhost
