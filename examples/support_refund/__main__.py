from examples.support_refund.agent import build_support_agent
from tenxgraph import Message

result = build_support_agent().invoke({"messages": [Message.text_message("refund order 1042")]}, {"thread_id": "t1"})
print(result.final_text)
