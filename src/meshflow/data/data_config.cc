#include "meshflow/data/data_config.h"

#include "meshflow/config/json_reader.h"

namespace meshflow {

Result<DataConfig> parse_data_config(const nlohmann::json& j) {
  JsonObjectReader r(j, "data");
  std::string type;
  r.choice("type", &type, {"fashion_mnist", "fortunes"});
  r.required("type");
  if (type == "fortunes") {
    TextOptions o;
    r.string("dir", &o.dir);
    float eval_fraction = static_cast<float>(o.eval_fraction);
    r.number("eval_fraction", &eval_fraction, 0.0, 0.99);
    int64_t split_seed = 0;
    r.integer("split_seed", &split_seed, 0);
    MF_RETURN_IF_ERROR(r.finish());
    o.eval_fraction = eval_fraction;
    o.split_seed = static_cast<uint64_t>(split_seed);
    return DataConfig(o);
  }
  FashionMnistOptions o;
  r.string("dir", &o.dir);
  r.integer("validation", &o.validation, 0);
  std::string eval_on = "test";
  r.choice("eval_on", &eval_on, {"test", "validation"});
  r.boolean("normalize", &o.normalize);
  MF_RETURN_IF_ERROR(r.finish());
  o.eval_on_validation = eval_on == "validation";
  if (o.eval_on_validation && o.validation == 0)
    return Status::invalid("data.eval_on is \"validation\" but data.validation is 0; set "
                           "data.validation to the number of training images to hold out");
  return DataConfig(o);
}

Result<std::unique_ptr<Dataset>> open_dataset(const DataConfig& cfg, int64_t seq_len) {
  if (const auto* o = std::get_if<FashionMnistOptions>(&cfg)) {
    MF_ASSIGN_OR_RETURN(FashionMnist ds, FashionMnist::load(*o));
    return std::unique_ptr<Dataset>(std::make_unique<FashionMnist>(std::move(ds)));
  }
  TextOptions o = std::get<TextOptions>(cfg);
  o.seq_len = seq_len;
  MF_ASSIGN_OR_RETURN(TextDataset ds, TextDataset::from_fortunes(o));
  return std::unique_ptr<Dataset>(std::make_unique<TextDataset>(std::move(ds)));
}

}  // namespace meshflow
